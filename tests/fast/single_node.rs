//! The single-node path keeps its shape after the Cluster work: one script call per check, even
//! with several limits, and a flushed script cache is reloaded transparently.

use crate::support::commandstats::{script_calls, wait_for_start_up_polls};
use crate::support::{redis_config, RedisServer, Tollgate, QUIET_POLL};

// A bucket's key lives until the bucket is full again: one token a minute keeps the keys of
// the 21 checks below for 21 minutes, long after a starved machine gets to read them.
const LIMITS: &str = "[[limits]]\nname = \"per-ip\"\nrate = \"1/min\"\nburst = 100\nkey = [\"ip\"]\n\n\
                      [[limits]]\nname = \"per-user\"\nrate = \"1/min\"\nburst = 100\nkey = [\"header:x-user\"]\n";

#[test]
fn one_check_with_two_limits_is_one_script_call() {
    let redis = RedisServer::start();
    // Borrowing off: it answers a hot key's checks from slices, without a call (counted by
    // borrowing::); this test is about the shape of the call each check makes.
    let store = format!("{QUIET_POLL}\nborrow = false");
    let tollgate = Tollgate::start(&redis_config(&redis, &store, LIMITS));
    wait_for_start_up_polls(&redis, 1);
    let mut client = tollgate.client();
    // The first check loads the script (EVAL): count from the second on.
    client.get("/check", &[("x-user", "alice")]).unwrap();
    let before = script_calls(&redis);
    for _ in 0..20 {
        let r = client.get("/check", &[("x-user", "alice")]).unwrap();
        assert_eq!(r.status, 200);
        assert!(r.header("ratelimit").is_some());
    }
    assert_eq!(script_calls(&redis) - before, 20);
    let keys = redis.cli(&["KEYS", "tollgate:*"]);
    assert!(keys.contains("tollgate:per-user:{alice}"), "{keys}");

    redis.cli(&["SCRIPT", "FLUSH"]);
    let r = client.get("/check", &[("x-user", "alice")]).unwrap();
    assert!(
        r.header("ratelimit").is_some(),
        "NOSCRIPT is answered by EVAL"
    );
}
