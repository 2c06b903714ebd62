use proptest::prelude::*;

use super::*;

/// A header lookup over `(name, value)` pairs, as the handlers give one.
fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> + 'a {
    move |name| {
        pairs
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| *value)
    }
}

fn read(pairs: &'static [(&'static str, &'static str)]) -> Incoming<'static> {
    incoming(headers(pairs))
}

fn id<const N: usize>(text: &str) -> [u8; N] {
    hex_lower::<N>(text).unwrap()
}

const W3C_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const W3C_SPAN: &str = "b7ad6b7169203331";

#[test]
fn the_w3c_examples_are_read_with_their_sampled_flag_and_tracestate() {
    let sampled = read(&[
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("tracestate", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
    ]);
    assert_eq!(
        sampled,
        Incoming {
            parent: Some(RemoteSpan {
                trace_id: id(W3C_TRACE),
                span_id: id(W3C_SPAN),
                trace_state: "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
            }),
            sampled: Some(true),
        }
    );
    let not = read(&[(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
    )]);
    assert_eq!(not.sampled, Some(false));
    assert_eq!(not.parent.unwrap().trace_state, "");
}

#[test]
fn a_later_w3c_version_may_carry_more_fields() {
    let future = read(&[(
        "traceparent",
        "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-the-future-will-be-like",
    )]);
    assert_eq!(future.parent.unwrap().trace_id, id(W3C_TRACE));
    assert_eq!(future.sampled, Some(true));
}

#[test]
fn malformed_traceparents_are_ignored() {
    for bad in [
        "",
        "00",
        // Version 00 has exactly four fields.
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        // Version ff is invalid.
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        // All-zero ids.
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        // Uppercase hex.
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
        // Wrong lengths and separators.
        "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
        "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g",
        // A later version must separate what it appends.
        "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x",
        // Multi-byte characters where digits belong.
        "00-0af7651916cd43dd8448eb211c8031é-b7ad6b7169203331-01",
    ] {
        let pairs = [("traceparent", bad)];
        assert_eq!(incoming(headers(&pairs)), Incoming::default(), "{bad:?}");
    }
}

#[test]
fn a_tracestate_without_a_traceparent_or_too_long_is_not_passed_on() {
    assert_eq!(read(&[("tracestate", "rojo=1")]), Incoming::default());
    let long = "a=".to_string() + &"b".repeat(MAX_TRACE_STATE);
    let pairs = [
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("tracestate", long.as_str()),
    ];
    let with_long = incoming(headers(&pairs));
    assert_eq!(with_long.parent.unwrap().trace_state, "");
}

#[test]
fn the_b3_single_header_examples_are_read() {
    let full = read(&[(
        "b3",
        "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90",
    )]);
    assert_eq!(
        full.parent.unwrap().trace_id,
        id("80f198ee56343ba864fe8b2a57d3eff7")
    );
    assert_eq!(full.parent.unwrap().span_id, id("e457b5a2e4d86bd1"));
    assert_eq!(full.sampled, Some(true));
    let deferred = read(&[("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1")]);
    assert!(deferred.parent.is_some());
    assert_eq!(deferred.sampled, None);
    let debug = read(&[("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-d")]);
    assert_eq!(debug.sampled, Some(true));
    assert_eq!(
        read(&[("b3", "0")]),
        Incoming {
            parent: None,
            sampled: Some(false)
        }
    );
    assert_eq!(
        read(&[("b3", "d")]),
        Incoming {
            parent: None,
            sampled: Some(true)
        }
    );
    // A 64-bit trace id is the low half of a 128-bit one.
    let short = read(&[("b3", "463ac35c9f6413ad-463ac35c9f6413ad-1")]);
    assert_eq!(
        short.parent.unwrap().trace_id,
        id("0000000000000000463ac35c9f6413ad")
    );
}

#[test]
fn the_b3_multi_header_example_is_read() {
    let multi = read(&[
        ("x-b3-traceid", "80f198ee56343ba864fe8b2a57d3eff7"),
        ("x-b3-parentspanid", "05e3ac9a4f6e3b90"),
        ("x-b3-spanid", "e457b5a2e4d86bd1"),
        ("x-b3-sampled", "1"),
    ]);
    assert_eq!(multi.parent.unwrap().span_id, id("e457b5a2e4d86bd1"));
    assert_eq!(multi.sampled, Some(true));
    let debug = read(&[
        ("x-b3-traceid", "80f198ee56343ba864fe8b2a57d3eff7"),
        ("x-b3-spanid", "e457b5a2e4d86bd1"),
        ("x-b3-sampled", "0"),
        ("x-b3-flags", "1"),
    ]);
    assert_eq!(debug.sampled, Some(true));
    assert_eq!(read(&[("x-b3-sampled", "0")]).sampled, Some(false));
    // A trace id without a span id names no span.
    assert_eq!(
        read(&[("x-b3-traceid", "80f198ee56343ba864fe8b2a57d3eff7")]),
        Incoming::default()
    );
    assert_eq!(
        read(&[
            ("x-b3-traceid", "80f198ee56343ba864fe8b2a57d3eff7"),
            ("x-b3-spanid", "e457b5a2e4d86bd1"),
            ("x-b3-sampled", "yes"),
        ]),
        Incoming::default()
    );
}

#[test]
fn traceparent_wins_over_b3_and_a_bad_one_gives_way_to_it() {
    let both = read(&[
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-0"),
    ]);
    assert_eq!(both.parent.unwrap().trace_id, id(W3C_TRACE));
    let bad_w3c = read(&[
        ("traceparent", "garbage"),
        ("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-0"),
    ]);
    assert_eq!(bad_w3c.sampled, Some(false));
}

#[test]
fn the_sampler_follows_the_caller_and_otherwise_the_rate() {
    let none = Sampler::new(0.0);
    let all = Sampler::new(1.0);
    let trace = id::<16>(W3C_TRACE);
    assert!(none.sampled(&trace, Some(true)));
    assert!(!all.sampled(&trace, Some(false)));
    assert!(!none.sampled(&trace, None));
    assert!(all.sampled(&trace, None));
    // The low 63 bits of the id against rate * 2^63, as the OpenTelemetry SDKs compare.
    let low = id::<16>("ffffffffffffffff0000000000000001");
    let high = id::<16>("0000000000000000fffffffffffffffe");
    let half = Sampler::new(0.5);
    assert!(half.sampled(&low, None));
    assert!(!half.sampled(&high, None));
    assert!(!Sampler::new(f64::NAN).sampled(&low, None));
}

#[test]
fn one_percent_of_random_traces_is_about_one_percent() {
    let sampler = Sampler::new(0.01);
    let sampled = (0..100_000)
        .filter(|_| sampler.sampled(&new_trace_id(), None))
        .count();
    // Binomial(100000, 0.01): mean 1000, standard deviation about 31.
    assert!((700..1300).contains(&sampled), "{sampled}");
}

#[test]
fn new_ids_are_never_zero_and_differ() {
    let a = new_trace_id();
    let b = new_trace_id();
    assert_ne!(a, b);
    assert_ne!(a, [0; 16]);
    assert_ne!(new_span_id(), [0; 8]);
    assert_eq!(hex(&[0x0a, 0xff]), "0aff");
}

proptest! {
    #[test]
    fn hostile_headers_never_panic(
        traceparent in ".{0,80}",
        b3 in ".{0,80}",
        trace in "[0-9a-fA-F-]{0,40}",
        span in "[0-9a-fA-F]{0,20}",
        sampled in ".{0,3}",
    ) {
        let pairs = [
            ("traceparent", traceparent.as_str()),
            ("tracestate", traceparent.as_str()),
            ("b3", b3.as_str()),
            ("x-b3-traceid", trace.as_str()),
            ("x-b3-spanid", span.as_str()),
            ("x-b3-sampled", sampled.as_str()),
        ];
        let found = incoming(headers(&pairs));
        if let Some(parent) = found.parent {
            prop_assert_ne!(parent.trace_id, [0; 16]);
            prop_assert_ne!(parent.span_id, [0; 8]);
        }
    }

    #[test]
    fn any_traceparent_it_writes_is_read_back(trace in any::<[u8; 16]>(), span in any::<[u8; 8]>(), flags in any::<u8>()) {
        prop_assume!(trace != [0; 16] && span != [0; 8]);
        let header = format!("00-{}-{}-{}", hex(&trace), hex(&span), hex(&[flags]));
        let pairs = [("traceparent", header.as_str())];
        let found = incoming(headers(&pairs));
        prop_assert_eq!(found.parent.map(|p| (p.trace_id, p.span_id)), Some((trace, span)));
        prop_assert_eq!(found.sampled, Some(flags & 1 == 1));
    }
}
