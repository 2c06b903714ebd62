//! How long a test's clients surely kept a token bucket from filling up: what a floor on
//! admissions may count on a loaded machine (the bound counts the whole run).

/// How long the clients surely pressed on the bucket, in seconds, from their requests'
/// `(sent, answered)` instants (seconds from one origin): the moments from the first answer
/// to the last request sent that had a request both sent and answered less than `fill_secs`
/// before them.
///
/// Why: only while the bucket is full does a token bucket drop refill, and it fills up only
/// when no decision takes from it for `(burst - 1) / rate` (`fill_secs`) after one that left
/// it below one token, as each does under this load but the first after a stall. A request
/// sent and answered within that span was decided within it. A machine that stalls the
/// clients, the instances or the store for longer (a 0.6 s call was seen at load 12 beside
/// CPU burners) makes any bucket drop refill, and the moments after `fill_secs` of such a
/// stall are not counted; the run's start (before the first answer, when the bucket is
/// created full) and end (after the last request sent) are not either.
pub fn pressed(spans: &[(f64, f64)], fill_secs: f64) -> f64 {
    const STEP: f64 = 0.001;
    let Some(from) = spans.iter().map(|s| s.1).reduce(f64::min) else {
        return 0.0;
    };
    let to = spans.iter().map(|s| s.0).fold(from, f64::max);
    let mut by_answer = spans.to_vec();
    by_answer.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (mut next, mut last_sent, mut pressed) = (0, f64::NEG_INFINITY, 0.0);
    let mut at = from + STEP;
    while at <= to {
        while next < by_answer.len() && by_answer[next].1 <= at {
            last_sent = last_sent.max(by_answer[next].0);
            next += 1;
        }
        if last_sent > at - fill_secs {
            pressed += STEP;
        }
        at += STEP;
    }
    pressed
}
