//! The one place a [`Meter`] is told apart: every question about a key's kind is handed from
//! here to the kind's own file, through one match (`with_kind!`) that calls each kind
//! directly, so the memory store's hot path pays no indirect call; and the few questions that
//! name one kind's data (a quota's period, a lease, a reservation, a borrow).

use super::borrow::Borrow;
use super::bucket::Bucket;
use super::concurrency::Lease;
use super::reserve::Reserve;
use super::twin::{Beside, Found, Keep, Kept, Stored};
use super::{
    BucketOutcome, BucketRequest, Configured, Kind, LimitView, Meter, PeekView, Peeked,
    ReportCharge, Reserved, ScriptArg, Slice, Window,
};
use crate::base::calendar::Period;

/// `$body` with `$kind` bound to the kind `$meter` counts with: the one match of the kinds.
macro_rules! with_kind {
    ($meter:expr, $kind:ident => $body:expr) => {
        match $meter {
            Meter::Bucket => {
                let $kind = &Bucket;
                $body
            }
            Meter::Quota($kind) => $body,
            Meter::Concurrency($kind) => $body,
            Meter::Reserve($kind) => $body,
            Meter::Borrow($kind) => $body,
            Meter::Global($kind) => $body,
        }
    };
}

impl Meter {
    /// A plain token bucket: no reservation, no borrowing. Only such a bucket is raised by
    /// time alone (what the deny cache needs), shared among Envoys (RLQS) or lent.
    pub fn is_plain_bucket(&self) -> bool {
        matches!(self, Meter::Bucket)
    }

    /// A quota's period.
    pub fn period(&self) -> Option<Period> {
        match self {
            Meter::Quota(period) => Some(*period),
            _ => None,
        }
    }

    /// A concurrency key's lease.
    pub fn lease(&self) -> Option<Lease> {
        match self {
            Meter::Concurrency(lease) => Some(*lease),
            _ => None,
        }
    }

    /// A reserving bucket's reservation.
    pub fn reserve(&self) -> Option<Reserve> {
        match self {
            Meter::Reserve(reserve) => Some(*reserve),
            _ => None,
        }
    }

    /// What a borrowing bucket (or a borrowing global limit's key) asks besides its cost.
    pub fn borrow(&self) -> Option<Borrow> {
        match self {
            Meter::Borrow(borrow) => Some(*borrow),
            Meter::Global(global) => global.borrow,
            _ => None,
        }
    }

    /// A meter an instance may borrow slices of: a plain token bucket, or a global limit's key
    /// in its region (whose held slices count against the size in force, `kinds::global`).
    pub fn lends(&self) -> bool {
        matches!(self, Meter::Bucket | Meter::Global(_))
    }

    /// The meter of a charge reported by key (`POST /report`): a reserving bucket holds no
    /// reservation for it and pays as a plain bucket, in debt like any report.
    #[must_use]
    pub fn reported(self) -> Meter {
        match self {
            Meter::Reserve(_) => Meter::Bucket,
            other => other,
        }
    }
}

/// A meter answers every question as its kind does (each method hands it on, defaults
/// included). Each is inlined: a lone bucket's decision in the memory store asks four of
/// them, and the call in between cost it about 5% (`cargo bench --bench memory_store`).
impl Kind for Meter {
    #[inline]
    fn is_token_bucket(&self) -> bool {
        with_kind!(self, kind => kind.is_token_bucket())
    }

    #[inline]
    fn for_check(&self) -> Meter {
        with_kind!(self, kind => kind.for_check())
    }

    #[inline]
    fn policy_window_secs(&self, rate: f64, burst: u64) -> u64 {
        with_kind!(self, kind => kind.policy_window_secs(rate, burst))
    }

    #[inline]
    fn refuses_overrides(&self) -> Option<&'static str> {
        with_kind!(self, kind => kind.refuses_overrides())
    }

    #[inline]
    fn limit_view(&self, limit: &Configured<'_>) -> LimitView {
        with_kind!(self, kind => kind.limit_view(limit))
    }

    #[inline]
    fn script_arg(&self, rate: f64) -> ScriptArg {
        with_kind!(self, kind => kind.script_arg(rate))
    }

    #[inline]
    fn peek_arg(&self, rate: f64) -> ScriptArg {
        with_kind!(self, kind => kind.peek_arg(rate))
    }

    #[inline]
    fn level_scale(&self) -> f64 {
        with_kind!(self, kind => kind.level_scale())
    }

    #[inline]
    fn read_window(&self, numbers: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Window>> {
        with_kind!(self, kind => kind.read_window(numbers))
    }

    #[inline]
    fn read_slice(
        &self,
        numbers: &mut dyn FnMut() -> Option<u64>,
        index: usize,
        now: &str,
    ) -> Option<Option<Slice>> {
        with_kind!(self, kind => kind.read_slice(numbers, index, now))
    }

    #[inline]
    fn read_held(&self, numbers: &mut dyn FnMut() -> Option<u64>) -> Option<Option<Reserved>> {
        with_kind!(self, kind => kind.read_held(numbers))
    }

    #[inline]
    fn find(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        now_us: u64,
    ) -> (BucketOutcome, u64) {
        with_kind!(self, kind => kind.find(request, stored, now_us))
    }

    #[inline]
    fn charge(
        &self,
        request: &BucketRequest,
        debt: u64,
        outcome: &mut BucketOutcome,
        state: &mut Option<Stored>,
        now_us: u64,
    ) {
        with_kind!(self, kind => kind.charge(request, debt, outcome, state, now_us));
    }

    #[inline]
    fn report(
        &self,
        charge: &ReportCharge,
        state: &mut Option<Stored>,
        now_us: u64,
    ) -> BucketOutcome {
        with_kind!(self, kind => kind.report(charge, state, now_us))
    }

    #[inline]
    fn forget_at_us(&self, stored: &Stored, rate: f64) -> u64 {
        with_kind!(self, kind => kind.forget_at_us(stored, rate))
    }

    #[inline]
    fn alone(&self, key: &str, beside: &Beside) -> bool {
        with_kind!(self, kind => kind.alone(key, beside))
    }

    #[inline]
    fn find_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &mut Beside,
        now_us: u64,
    ) -> Found {
        with_kind!(self, kind => kind.find_in(request, stored, beside, now_us))
    }

    #[inline]
    fn keep_in(&self, keep: Keep<'_>, beside: &mut Beside) -> Kept {
        with_kind!(self, kind => kind.keep_in(keep, beside))
    }

    #[inline]
    fn peek_in(
        &self,
        request: &BucketRequest,
        stored: Option<Stored>,
        beside: &Beside,
        now_us: u64,
    ) -> BucketOutcome {
        with_kind!(self, kind => kind.peek_in(request, stored, beside, now_us))
    }

    #[inline]
    fn holds_aside(&self) -> bool {
        with_kind!(self, kind => kind.holds_aside())
    }

    #[inline]
    fn held_in(&self, key: &str, beside: &Beside, now_us: u64) -> Reserved {
        with_kind!(self, kind => kind.held_in(key, beside, now_us))
    }

    #[inline]
    fn peek_view(&self, request: &BucketRequest, peeked: &Peeked) -> PeekView {
        with_kind!(self, kind => kind.peek_view(request, peeked))
    }
}
