use super::*;

#[test]
fn each_kind_is_spelled_to_the_scripts_as_they_split_it() {
    let lease = Lease {
        ttl_ms: 30_000,
        id: 0xab,
    };
    let reserve = Reserve {
        ttl_ms: 60_000,
        id: 1,
        refund: true,
    };
    let borrow = Borrow {
        grid_us: 0,
        want: 4,
        give: None,
    };
    let spelled = |meter: Meter| (meter.script_arg(2.5), meter.peek_arg(2.5));
    assert_eq!(
        spelled(Meter::Bucket),
        (ScriptArg::Number(2.5), ScriptArg::Text("2.5".into()))
    );
    assert_eq!(
        spelled(Meter::Quota(Period::Day)),
        (ScriptArg::Code("d"), ScriptArg::Code("d"))
    );
    assert_eq!(
        spelled(Meter::Concurrency(lease)),
        (
            ScriptArg::Text(format!("L30000:{:032x}", 0xab)),
            ScriptArg::Code("L")
        )
    );
    assert_eq!(
        spelled(Meter::Reserve(reserve)),
        (
            ScriptArg::Text(format!("R60000:{:032x}:r:2.5", 1)),
            ScriptArg::Text("Rr2.5".into())
        )
    );
    assert_eq!(
        spelled(Meter::Borrow(borrow)),
        (
            ScriptArg::Text("B1:4:0:0:0:0:2.5".into()),
            ScriptArg::Text("B2.5".into())
        )
    );
}

#[test]
fn only_a_quota_reads_its_window_from_the_reply() {
    let mut numbers = [0_u64, 3600, 7].into_iter();
    let window = Meter::Quota(Period::Hour).read_window(&mut || numbers.next());
    assert_eq!(
        window,
        Some(Some(Window {
            ends_in_s: 1,
            length_s: 3600
        }))
    );
    assert_eq!(numbers.next(), Some(7), "two numbers read, no more");
    assert_eq!(Meter::Quota(Period::Hour).read_window(&mut || None), None);
    assert_eq!(
        Meter::Bucket.read_window(&mut || panic!("read")),
        Some(None)
    );
    let lease = Lease {
        ttl_ms: 1500,
        id: 0,
    };
    assert_eq!(
        Meter::Concurrency(lease).read_window(&mut || None),
        Some(Some(Window {
            ends_in_s: 1,
            length_s: 2
        }))
    );
}
