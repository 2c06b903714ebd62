//! Value types every layer above uses: time, rates, the spelling of store keys, redaction, the
//! intervals of the background duties; reading an operator's file up to a cap.

pub mod calendar;
pub mod clock;
pub mod go;
pub mod keys;
pub mod normalise;
pub mod rate;
pub mod read;
pub mod redact;
pub mod timings;
