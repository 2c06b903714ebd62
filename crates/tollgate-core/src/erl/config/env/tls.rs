//! envoyproxy/ratelimit's TLS files: the Redis connection's (`REDIS_TLS_*`) and the gRPC
//! listener's (`GRPC_SERVER_TLS_*`, `GRPC_CLIENT_TLS_*`), each read only when its switch is
//! true, as there; an empty one is unset. The files are read and checked here, a refusal
//! naming the variable that named the file.

use std::path::PathBuf;

use super::{
    in_words_of, ErlEnv, Var, GRPC_CLIENT_TLS_CACERT, GRPC_CLIENT_TLS_SAN, GRPC_SERVER_TLS_CERT,
    GRPC_SERVER_TLS_KEY, GRPC_SERVER_USE_TLS, REDIS_TLS, REDIS_TLS_CACERT, REDIS_TLS_CLIENT_CERT,
    REDIS_TLS_CLIENT_KEY,
};
use crate::config::grpc_tls::GrpcTlsConfig;
use crate::config::store_tls;
use crate::config::tls_files::TlsFiles;
use crate::config::ConfigError;

/// `store.tls`, with `REDIS_TLS` true (`use_tls`); none of its files set: `None`.
pub(super) fn store(env: &ErlEnv, use_tls: bool) -> Result<Option<TlsFiles>, ConfigError> {
    if !use_tls {
        return Ok(None);
    }
    let file = |row: &Var| env.set(row).map(PathBuf::from);
    let tls = TlsFiles {
        ca_file: file(&REDIS_TLS_CACERT),
        cert_file: file(&REDIS_TLS_CLIENT_CERT),
        key_file: file(&REDIS_TLS_CLIENT_KEY),
    };
    if tls.is_empty() {
        return Ok(None);
    }
    let rows = [
        &REDIS_TLS_CACERT,
        &REDIS_TLS_CLIENT_CERT,
        &REDIS_TLS_CLIENT_KEY,
    ];
    store_tls::load(&tls).map_err(|e| in_words_of(e, &rows, &REDIS_TLS))?;
    Ok(Some(tls))
}

/// `grpc_tls`, with `GRPC_SERVER_USE_TLS` true (`use_tls`): the certificate and its key are
/// required then; `GRPC_CLIENT_TLS_CACERT` asks for and verifies a client certificate,
/// `GRPC_CLIENT_TLS_SAN` names what it must carry.
pub(super) fn grpc(env: &ErlEnv, use_tls: bool) -> Result<Option<GrpcTlsConfig>, ConfigError> {
    if !use_tls {
        return Ok(None);
    }
    let required = |row: &Var| {
        env.set(row)
            .map(PathBuf::from)
            .ok_or_else(|| row.refuse("must name a PEM file when GRPC_SERVER_USE_TLS is true"))
    };
    let tls = GrpcTlsConfig {
        files: TlsFiles {
            cert_file: Some(required(&GRPC_SERVER_TLS_CERT)?),
            key_file: Some(required(&GRPC_SERVER_TLS_KEY)?),
            ca_file: env.set(&GRPC_CLIENT_TLS_CACERT).map(PathBuf::from),
        },
        client_san: env.set(&GRPC_CLIENT_TLS_SAN).map(String::from),
    };
    let rows = [
        &GRPC_CLIENT_TLS_CACERT,
        &GRPC_SERVER_TLS_CERT,
        &GRPC_SERVER_TLS_KEY,
        &GRPC_CLIENT_TLS_SAN,
    ];
    tls.load()
        .map_err(|e| in_words_of(e, &rows, &GRPC_SERVER_USE_TLS))?;
    Ok(Some(tls))
}
