//! The first thing a new user does: run tollgate with no config and see a 200 then a 429.

use crate::support::Tollgate;

#[test]
fn default_config_limits_each_client_ip() {
    let tollgate = Tollgate::start("");
    let mut client = tollgate.client();
    let first = client.get("/check", &[]).unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(first.header("ratelimit"), Some("\"per-ip\";r=99;t=1"));
    let statuses: Vec<u16> = (0..150)
        .map(|_| client.get("/check", &[]).unwrap().status)
        .collect();
    assert!(
        statuses.contains(&429),
        "the default burst of 100 must run out"
    );
}
