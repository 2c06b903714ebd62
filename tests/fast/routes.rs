//! `/check` and every path below it decide; other paths are not checks.

use crate::support::Tollgate;

#[test]
fn paths_below_check_are_checks_and_others_are_not_found() {
    let tollgate = Tollgate::in_process("");
    let mut client = tollgate.client();
    for path in ["/check", "/check/", "/check/api/v1/items?x=1"] {
        let response = client.get(path, &[]).unwrap();
        assert_eq!(response.status, 200, "{path}");
        assert!(response.header("ratelimit").is_some(), "{path}");
    }
    for path in ["/checkout", "/", "/other/check"] {
        assert_eq!(client.get(path, &[]).unwrap().status, 404, "{path}");
    }
    assert_eq!(client.get("/healthz", &[]).unwrap().status, 200);
}
