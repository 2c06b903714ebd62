//! The Kubernetes manifests: strict validation, kustomizations, hardened pods, the Secret,
//! probes, the disruption budget and pod monitor, the shipped tollgate.toml.

use super::*;

#[test]
fn every_core_manifest_passes_kubernetes_validate_strict() {
    let objects = k8s_objects();
    let core: Vec<_> = objects.iter().filter(|(_, o)| !is_crd(o)).collect();
    let files: BTreeSet<_> = core.iter().map(|(path, _)| path.clone()).collect();
    assert!(core.len() >= 7, "manifests found: {}", core.len());
    let files: Vec<_> = files.into_iter().collect();
    deploy::assert_kubernetes_valid(&files, core.len());
}

#[test]
fn kustomizations_reference_only_files_that_exist() {
    for path in deploy::yaml_files(&repo_path("k8s"))
        .into_iter()
        .filter(|p| p.file_name().unwrap() == "kustomization.yaml" && ours(p))
    {
        let dir = path.parent().unwrap();
        let kustomization = &yaml_documents(&path)[0];
        assert_eq!(kustomization["kind"], "Kustomization");
        let resources = kustomization["resources"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let generated = ["configMapGenerator", "secretGenerator"]
            .iter()
            .flat_map(|g| kustomization[g].as_array().cloned().unwrap_or_default())
            .flat_map(|g| g["files"].as_array().cloned().unwrap_or_default());
        for entry in resources.iter().chain(generated.collect::<Vec<_>>().iter()) {
            let target = dir.join(entry.as_str().unwrap());
            assert!(
                target.is_file() || target.join("kustomization.yaml").is_file(),
                "{}: {} does not exist",
                path.display(),
                target.display()
            );
        }
    }
}

/// The pod templates of our workloads, by workload name.
fn pod_specs(objects: &[(std::path::PathBuf, Value)]) -> Vec<(String, Value)> {
    objects
        .iter()
        .filter(|(path, o)| ours(path) && o["kind"] == "Deployment")
        .map(|(_, o)| {
            (
                o["metadata"]["name"].as_str().unwrap().to_string(),
                o["spec"]["template"].clone(),
            )
        })
        .collect()
}

#[test]
fn pods_run_hardened_without_service_links_and_are_scraped_on_9090() {
    let objects = k8s_objects();
    let pods = pod_specs(&objects);
    assert_eq!(pods.len(), 2, "the sidecar and the standalone shapes");
    for (name, template) in &pods {
        let spec = &template["spec"];
        assert_eq!(spec["enableServiceLinks"], false, "{name}");
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(
            spec["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let annotations = &template["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/scrape"], "true", "{name}");
        assert_eq!(annotations["prometheus.io/port"], "9090", "{name}");
        assert_eq!(annotations["prometheus.io/path"], "/metrics", "{name}");
        let containers = spec["containers"].as_array().unwrap().iter();
        let init = spec["initContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for container in containers.chain(init.iter()) {
            let which = format!("{name}/{}", container["name"]);
            let security = &container["securityContext"];
            assert_eq!(security["readOnlyRootFilesystem"], true, "{which}");
            assert_eq!(security["allowPrivilegeEscalation"], false, "{which}");
            assert_eq!(
                security["capabilities"]["drop"],
                serde_json::json!(["ALL"]),
                "{which}"
            );
            assert!(security["runAsUser"].as_u64().unwrap() > 0, "{which}");
            assert!(
                container["resources"]["requests"]["cpu"].is_string(),
                "{which}"
            );
            assert!(
                container["resources"]["limits"]["memory"].is_string(),
                "{which}"
            );
        }
    }
}

fn tollgate_container(template: &Value) -> (Value, bool) {
    let spec = &template["spec"];
    for (list, is_init) in [("initContainers", true), ("containers", false)] {
        if let Some(found) = spec[list]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "tollgate"))
        {
            return (found.clone(), is_init);
        }
    }
    panic!("no tollgate container");
}

#[test]
fn tollgate_containers_read_redis_from_the_secret_and_are_probed() {
    let objects = k8s_objects();
    for (name, template) in pod_specs(&objects) {
        let (container, is_init) = tollgate_container(&template);
        if name == "edge" {
            assert!(is_init, "the sidecar is an init container");
            assert_eq!(
                container["restartPolicy"], "Always",
                "a native sidecar (>= 1.29)"
            );
        }
        let url = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "TOLLGATE_STORE__URL")
            .expect("TOLLGATE_STORE__URL");
        assert_eq!(url["valueFrom"]["secretKeyRef"]["name"], "tollgate-redis");
        for (probe, path) in [
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ] {
            assert_eq!(container[probe]["httpGet"]["path"], path, "{name} {probe}");
        }
        let ports: Vec<_> = container["ports"].as_array().unwrap().iter().collect();
        assert!(ports
            .iter()
            .any(|p| p["name"] == "metrics" && p["containerPort"] == 9090));
        let mount = &container["volumeMounts"][0];
        assert_eq!(mount["mountPath"], "/etc/tollgate");
        assert!(
            mount.get("subPath").is_none(),
            "a subPath mount never sees ConfigMap updates"
        );
    }
}

#[test]
fn the_disruption_budget_and_pod_monitor_select_the_tollgate_pods() {
    let objects = k8s_objects();
    let standalone = find(&objects, "Deployment", "tollgate");
    let labels = &standalone["spec"]["template"]["metadata"]["labels"];
    let pdb = find(&objects, "PodDisruptionBudget", "tollgate");
    for (key, value) in pdb["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&labels[key], value, "PDB selector {key}");
    }
    let service = find(&objects, "Service", "tollgate");
    assert_eq!(service["spec"]["ports"][0]["port"], 8080);

    let monitor = find(&objects, "PodMonitor", "tollgate");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    for (name, template) in pod_specs(&objects) {
        for (key, value) in selector {
            assert_eq!(
                &template["metadata"]["labels"][key], value,
                "{name} not scraped"
            );
        }
        let (container, _) = tollgate_container(&template);
        assert!(container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == endpoint["port"]));
    }
}

#[test]
fn the_kubernetes_tollgate_toml_passes_tollgate_validate() {
    let output = run(
        crate::support::tollgate_command()
            .args(["validate", "--config"])
            .arg(repo_path("k8s/base/tollgate.toml"))
            // As the Secret sets it in the pod.
            .env(
                "TOLLGATE_STORE__URL",
                "redis://:secret@redis.example.internal:6379/0",
            ),
        "",
    );
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("per-ip"), "{}", text(&output));
}

/// The shared Deployment is called by ingress pods: with the base config's loopback alone,
/// every client would be keyed on an ingress pod's address. Its container names whose
/// `X-Forwarded-For` to believe with a placeholder on which tollgate refuses to start, naming
/// the key, until the operator writes the ingress pods' CIDR there.
#[test]
fn the_standalone_deployment_starts_only_once_told_whom_to_trust() {
    let objects = k8s_objects();
    let standalone = find(&objects, "Deployment", "tollgate");
    let container = &standalone["spec"]["template"]["spec"]["containers"][0];
    let placeholder = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "TOLLGATE_CLIENT_IP__TRUSTED_PROXIES")
        .and_then(|e| e["value"].as_str())
        .expect("the standalone container sets whom to trust");
    let validate = |trusted: &str| {
        run(
            crate::support::tollgate_command()
                .args(["validate", "--config"])
                .arg(repo_path("k8s/base/tollgate.toml"))
                .env(
                    "TOLLGATE_STORE__URL",
                    "redis://:secret@redis.example.internal:6379/0",
                )
                .env("TOLLGATE_CLIENT_IP__TRUSTED_PROXIES", trusted),
            "",
        )
    };
    let refused = validate(placeholder);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        text(&refused).contains("client_ip.trusted_proxies"),
        "{}",
        text(&refused)
    );
    let replaced = validate(&placeholder.replace("REPLACE-WITH-INGRESS-POD-CIDR", "10.244.0.0/16"));
    assert!(replaced.status.success(), "{}", text(&replaced));
    assert!(
        text(&replaced).contains(r#"trusted ["10.244.0.0/16"]"#),
        "{}",
        text(&replaced)
    );
}
