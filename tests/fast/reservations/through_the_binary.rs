//! Reservations through the real binary: several instances on one Redis, the estimate header,
//! reports, late settles across reloads and instances.

use super::*;

/// The in-flight overshoot, closed: requests that each end up costing 30 tokens, all in
/// flight before the first report, against a budget of 100. Plain reports admit every one
/// of them; with `reserve = 30` at most the budget is ever taken, across three instances.
#[test]
fn in_flight_requests_never_take_more_than_the_budget() {
    let redis = RedisServer::start();
    let limits = reserving("").replace("reserve = 10", "reserve = 30");
    let instances: Vec<Tollgate> = (0..3).map(|_| start(&redis, &limits)).collect();
    let admitted = AtomicU64::new(0);
    let ids = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for worker in 0..6 {
            let (instances, admitted, ids) = (&instances, &admitted, &ids);
            scope.spawn(move || {
                for round in 0..4 {
                    let at = &instances[(worker + round) % instances.len()];
                    let answer = at.check(&[("x-api-key", "acme")]);
                    if answer.status == 200 {
                        admitted.fetch_add(1, Ordering::SeqCst);
                        let id = answer.header("x-tollgate-reservation").expect("an id");
                        ids.lock().expect("ids").push(id.to_owned());
                    } else {
                        assert_eq!(answer.status, 429, "{}", answer.body);
                    }
                }
            });
        }
    });
    // 100 tokens and 100/min of refill over the few seconds this took: at most 3 estimates
    // of 30 fit, and at least 3 did (the first three found a full bucket).
    assert_eq!(admitted.load(Ordering::SeqCst), 3);
    // Settled at their true cost, from another instance each: the difference comes back.
    for (i, id) in ids.into_inner().expect("ids").iter().enumerate() {
        let answer = json(&report(
            &instances[i % 3],
            &serde_json::json!({ "reservation": id, "cost": 5 }),
        ));
        assert_eq!(answer["settled"], true, "{answer}");
        let again = json(&report(
            &instances[(i + 1) % 3],
            &serde_json::json!({ "reservation": id, "cost": 5 }),
        ));
        assert_eq!(
            again["settled"], false,
            "a retry never settles twice: {again}"
        );
    }
    // 3 × 25 given back: 85 or more tokens now, so two more estimates of 30 fit.
    for _ in 0..2 {
        assert_eq!(instances[0].check(&[("x-api-key", "acme")]).status, 200);
    }
}

#[test]
fn the_header_raises_the_estimate_and_peek_shows_what_is_held() {
    let redis = RedisServer::start();
    let tollgate = start(&redis, &reserving(""));
    let answer = tollgate.check(&[("x-api-key", "acme"), ("x-estimate", "40")]);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let id = answer.header("x-tollgate-reservation").expect("an id");
    assert!(id.starts_with("tokens.") && id.ends_with(":40"), "{id}");
    // A smaller or malformed header reserves the configured least.
    for estimate in ["3", "many", "-5"] {
        let answer = tollgate.check(&[("x-api-key", "acme"), ("x-estimate", estimate)]);
        let id = answer.header("x-tollgate-reservation").expect("an id");
        assert!(id.ends_with(":10"), "{estimate}: {id}");
    }
    let peek = crate::support::http::admin_json(
        tollgate.admin,
        "GET",
        "/v1/buckets/tokens?key=acme",
        Some(TOKEN),
        "",
    );
    let peek = json(&peek);
    assert_eq!(peek["reservations"], 4, "{peek}");
    assert_eq!(peek["reserved"], 70, "{peek}");
    assert_eq!(peek["remaining"], 30, "{peek}");
    // An estimate past the burst is never admitted, whatever the bucket holds.
    let huge = tollgate.check(&[("x-api-key", "other"), ("x-estimate", "101")]);
    assert_eq!(huge.status, 429, "{}", huge.body);
}

#[test]
fn a_report_names_reservations_and_leases_or_is_refused_with_the_field() {
    let redis = RedisServer::start();
    let limits = format!("{}{ONE_SLOT_PER_KEY}", reserving(""));
    let tollgate = start(&redis, &limits);
    let answer = tollgate.check(&[("x-api-key", "acme")]);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let reservation = answer.header("x-tollgate-reservation").expect("an id");
    let lease = answer.header("x-tollgate-lease").expect("a lease");
    let both = json(&report(
        &tollgate,
        &serde_json::json!([
            { "reservation": reservation, "cost": 0 },
            { "lease": lease },
        ]),
    ));
    assert_eq!(both[0]["settled"], true, "{both}");
    assert_eq!(both[0]["remaining"], 100, "{both}");
    assert_eq!(both[1]["released"], true, "{both}");
    assert_eq!(tollgate.check(&[("x-api-key", "acme")]).status, 200);

    // A request that holds no reservation (its check failed open) is charged by key, as a
    // debt: the balance is never lost.
    let by_key = json(&report(
        &tollgate,
        &serde_json::json!({ "limit": "tokens", "key": ["acme"], "cost": 30 }),
    ));
    assert_eq!(by_key["remaining"], 60, "{by_key}");

    let refused = [
        (
            serde_json::json!({ "reservation": "tokens.00.zz", "cost": 1 }),
            "reservation",
        ),
        (serde_json::json!({ "reservation": reservation }), "cost"),
        (
            serde_json::json!({ "reservation": reservation, "cost": 1, "limit": "x" }),
            "limit",
        ),
        (
            serde_json::json!({ "reservation": lease, "cost": 1 }),
            "reservation",
        ),
        (serde_json::json!({ "lease": reservation }), "lease"),
    ];
    for (body, field) in refused {
        let answer = report(&tollgate, &body);
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        assert!(answer.body.contains(field), "{body}: {}", answer.body);
    }
}

/// A request that outlives `reservation_ttl_s` (a slow reader, a long generation) still pays
/// its actual cost: its settle applies late, once, under both expiry modes.
#[test]
fn a_request_that_outlives_its_reservation_still_pays() {
    let redis = RedisServer::start();
    let limits = format!(
        "{}reservation_ttl_s = 1\n{}",
        reserving(""),
        reserving("reservation_ttl_s = 1\non_reservation_expiry = \"refund\"\n")
            .replace("name = \"tokens\"", "name = \"refunded\"")
            .replace("x-api-key", "x-other")
    );
    let tollgate = start(&redis, &limits);
    let answer = tollgate.check(&[("x-api-key", "carol"), ("x-other", "dave")]);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let ids: Vec<&str> = answer
        .header("x-tollgate-reservation")
        .expect("ids")
        .split(',')
        .map(str::trim)
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    std::thread::sleep(Duration::from_millis(1_500));
    let body = serde_json::json!([
        { "reservation": ids[0], "cost": 90 },
        { "reservation": ids[1], "cost": 90 },
    ]);
    let late = json(&report(&tollgate, &body));
    for settled in late.as_array().expect("a list") {
        assert_eq!(settled["settled"], true, "{late}");
        // 100 tokens, 90 charged (a few refilled in the meantime).
        let remaining = settled["remaining"].as_u64().expect("remaining");
        assert!((10..=15).contains(&remaining), "{late}");
    }
    let again = json(&report(&tollgate, &body));
    for settled in again.as_array().expect("a list") {
        assert_eq!(settled["settled"], false, "once only: {again}");
    }
}

/// A reserving limit whose reservations expire after a second, `on_reservation_expiry = mode`;
/// its refill (one token an hour) moves nothing a test reads.
fn expiring(mode: &str) -> String {
    format!(
        "[[limits]]\nname = \"llm\"\nrate = \"1/h\"\nburst = 100\ncharge = \"report\"\nreserve = 10\nreservation_ttl_s = 1\non_reservation_expiry = \"{mode}\"\nkey = [\"header:x-user\"]\n"
    )
}

/// A reservation expires and is given back by `sweeper` (under `refund`); the user then spends
/// the whole bucket; `between` runs; `settler` settles the expired reservation late at cost 0.
/// Its estimate came back once already: the bucket stays empty and the next check is denied.
fn settle_late_across(sweeper: &Tollgate, settler: &Tollgate, between: impl FnOnce()) {
    let user = [("x-user", "ada")];
    let first = sweeper.check(&user);
    assert_eq!(first.status, 200, "{}", first.body);
    let expired = first
        .header("x-tollgate-reservation")
        .expect("an id")
        .to_owned();
    std::thread::sleep(Duration::from_millis(1_500));
    // Sweeps the first (its 10 back) and reserves 10 more.
    assert_eq!(sweeper.check(&user).status, 200);
    let spent = json(&report(
        sweeper,
        &serde_json::json!({ "limit": "llm", "key": ["ada"], "cost": 90 }),
    ));
    assert_eq!(spent["remaining"], 0, "{spent}");
    between();
    let late = json(&report(
        settler,
        &serde_json::json!({ "reservation": expired, "cost": 0 }),
    ));
    assert_eq!(late["settled"], true, "{late}");
    assert_eq!(
        late["remaining"], 0,
        "the estimate was given back at expiry, never again: {late}"
    );
    let next = settler.check(&user);
    assert_eq!(next.status, 429, "{}", next.body);
}

/// `on_reservation_expiry` changed from `refund` to `keep` by a reload between a reservation's
/// expiry and its late settle.
#[test]
fn a_late_settle_across_a_reload_of_the_expiry_mode_gives_back_once() {
    let redis = RedisServer::start();
    let tollgate = start(&redis, &expiring("refund"));
    settle_late_across(&tollgate, &tollgate, || {
        let text = std::fs::read_to_string(&tollgate.config_path).expect("config");
        std::fs::write(
            &tollgate.config_path,
            text.replace("\"refund\"", "\"keep\""),
        )
        .expect("rewrite config");
        tollgate.signal("HUP");
        assert!(crate::support::wait_until(Duration::from_secs(5), || {
            tollgate.metric("tollgate_config_reloads_total{result=\"success\"}") == 1.0
        }));
    });
}

/// Two instances on one Redis, one on `refund` (which expired the reservation) and one on
/// `keep` (which settles it): a rollout changing the mode.
#[test]
fn a_late_settle_on_an_instance_with_another_expiry_mode_gives_back_once() {
    let redis = RedisServer::start();
    let refunding = start(&redis, &expiring("refund"));
    let keeping = start(&redis, &expiring("keep"));
    settle_late_across(&refunding, &keeping, || {});
}
