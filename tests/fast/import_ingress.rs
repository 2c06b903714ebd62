//! `tollgate import ingress-nginx`: the binary on a `kubectl get ingress -A -o yaml` list, its
//! output accepted by `validate` as printed, what it cannot carry named on stderr, and
//! malformed input refused with exit 2 and one line.

use crate::support::chaos::run_tollgate;
use crate::support::deploy::repo_path;
use crate::support::TempDir;

fn fixture(name: &str) -> String {
    repo_path(&format!("tests/fixtures/ingress-nginx/{name}"))
        .display()
        .to_string()
}

#[test]
fn a_cluster_list_converts_to_a_config_that_validates_as_printed() {
    let (code, toml, stderr) =
        run_tollgate(&["import", "ingress-nginx", &fixture("cluster.yaml")], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    for expected in [
        "name = \"shop-storefront-rps\"\nrate = \"5/s\"\nburst = 10\nkey = [\"ip\"]",
        "name = \"shop-storefront-rpm\"\nrate = \"100/min\"\nburst = 200\nkey = [\"ip\"]",
        "cidrs = [\"10.0.0.0/8\", \"192.0.2.10/32\"]\nhosts = [\"shop.example.com\"]",
        "name = \"api-public-api-global\"\nrate = \"600/min\"\nburst = 600\nkey = [\"header:x-api-key\"]",
        "cidrs = [\"172.16.0.0/12\"]\nhosts = [\"api.example.com\"]\npath_prefix = \"/v2\"",
        "deny_status = 429",
    ] {
        assert!(toml.contains(expected), "missing {expected:?} in:\n{toml}");
    }
    // Named in the output and on stderr, never dropped silently; still exit 0.
    for annotation in ["limit-connections", "limit-rate"] {
        assert!(toml.contains(annotation), "{toml}");
        assert!(stderr.contains(annotation), "{stderr}");
    }
    assert!(stderr.contains("503"), "{stderr}");

    let dir = TempDir::new("import-ingress");
    let path = dir.write("imported.toml", &toml);
    let (code, stdout, stderr) =
        run_tollgate(&["validate", "--config", &path.display().to_string()], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("limits        4"), "{stdout}");
    assert!(stdout.contains("exempt        2"), "{stdout}");
}

#[test]
fn each_proxy_gets_its_snippet() {
    for (proxy, expected) in [
        ("nginx", "auth_request /_tollgate;"),
        ("traefik", "forwardAuth:"),
        ("envoy", "kind: SecurityPolicy"),
    ] {
        let (code, stdout, stderr) = run_tollgate(
            &[
                "import",
                "ingress-nginx",
                "--proxy",
                proxy,
                &fixture("cluster.yaml"),
            ],
            &[],
        );
        assert_eq!(code, Some(0), "{stderr}");
        assert!(stdout.contains(expected), "{proxy}: {stdout}");
    }
}

#[test]
fn malformed_yaml_or_values_exit_2_with_one_line_naming_the_object_and_annotation() {
    let dir = TempDir::new("import-ingress-bad");
    let yaml = dir.write("bad.yaml", "kind: Ingress\nmetadata: [unclosed\n");
    let value = dir.write(
        "value.yaml",
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: web\n  namespace: prod\n  annotations:\n    nginx.ingress.kubernetes.io/limit-rps: \"fast\"\n",
    );
    for (file, names) in [
        (&yaml, vec![yaml.display().to_string()]),
        (
            &value,
            vec![
                "Ingress prod/web".to_string(),
                "nginx.ingress.kubernetes.io/limit-rps".to_string(),
            ],
        ),
    ] {
        let (code, stdout, stderr) = run_tollgate(
            &["import", "ingress-nginx", &file.display().to_string()],
            &[],
        );
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        for name in names {
            assert!(stderr.contains(&name), "{name} in {stderr}");
        }
    }
}
