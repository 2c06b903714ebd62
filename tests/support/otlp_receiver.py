"""An OTLP trace receiver for tests: OTLP/gRPC and OTLP/HTTP (protobuf), decoded with the
OpenTelemetry project's own generated messages (pip opentelemetry-proto), every span written
as one JSON line (the OTLP JSON mapping, ids in hex) to the file named by argv[1].

Usage: otlp_receiver.py SPANS_FILE PORTS_FILE. Both listeners bind 127.0.0.1 on ports the
kernel picks; "grpc_port http_port" is written to PORTS_FILE once both serve.
"""

import base64
import json
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

SPANS_FILE, PORTS_FILE = sys.argv[1], sys.argv[2]
LOCK = threading.Lock()


def hex_id(text):
    return base64.b64decode(text).hex() if text else ""


def record(request, protocol, headers):
    """Appends each span of an ExportTraceServiceRequest, with its resource and how it came."""
    lines = []
    for resource_spans in json_format.MessageToDict(request).get("resourceSpans", []):
        resource = {
            a["key"]: a["value"] for a in resource_spans.get("resource", {}).get("attributes", [])
        }
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    span[key] = hex_id(span.get(key, ""))
                span["attributes"] = {a["key"]: a["value"] for a in span.get("attributes", [])}
                span["resource"] = resource
                span["protocol"] = protocol
                span["headers"] = headers
                lines.append(json.dumps(span))
    with LOCK, open(SPANS_FILE, "a") as out:
        for line in lines:
            out.write(line + "\n")


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        headers = {k: v for k, v in context.invocation_metadata() if not k.startswith(":")}
        record(request, "grpc", headers)
        return trace_service_pb2.ExportTraceServiceResponse()


class HttpHandler(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        record(request, "http", {k.lower(): v for k, v in self.headers.items()})
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    http = ThreadingHTTPServer(("127.0.0.1", 0), HttpHandler)
    with open(PORTS_FILE + ".tmp", "w") as out:
        out.write(f"{grpc_port} {http.server_address[1]}\n")
    import os

    os.rename(PORTS_FILE + ".tmp", PORTS_FILE)
    http.serve_forever()


if __name__ == "__main__":
    main()
