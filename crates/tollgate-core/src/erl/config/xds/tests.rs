use super::*;
use crate::config::tls_files::TlsFiles;

#[test]
fn tls_files_apply_only_with_tls() {
    let xds = XdsConfig {
        files: TlsFiles {
            ca_file: Some("ca.pem".into()),
            ..TlsFiles::default()
        },
        ..XdsConfig::default()
    };
    assert_eq!(xds.check().unwrap_err().key, "envoy.xds.ca_file");
}

#[test]
fn host_port_is_all_a_server_may_be() {
    for good in [
        "localhost:18000",
        "10.0.0.1:1",
        "[::1]:18000",
        "eg.svc.cluster.local:18001",
    ] {
        assert!(is_host_port(good), "{good}");
    }
    for bad in [
        "localhost",
        ":18000",
        "host:0",
        "host:99999",
        "dns:///host:1",
        "::1:80",
    ] {
        assert!(!is_host_port(bad), "{bad}");
    }
}
