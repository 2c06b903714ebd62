//! A global limit's share in Redis: `lua/global_share.lua` writes it beside the key's bucket,
//! after bringing the bucket to now under the old one, in one atomic call.

use std::time::Instant;

use redis::Value;

use super::RedisStore;
use crate::kinds::global::Share;
use crate::kinds::{BucketRequest, Kind, Meter};
use crate::store::StoreError;

impl RedisStore {
    /// `lua/global_share.lua` for `request`'s key: its level (micro-tokens) and Redis's now.
    pub(super) async fn put_share_at(
        &self,
        request: &BucketRequest,
        share: Share,
    ) -> Result<(f64, u64), StoreError> {
        if !matches!(request.meter, Meter::Global(_)) {
            return Err(StoreError::Other("not a global limit's key".into()));
        }
        let reply = self
            .run_script(
                &self.global_share_script,
                &[request.key.as_str()],
                |cmd| {
                    super::wire::script_arg(cmd, request.meter.script_arg(request.rate))
                        .arg(request.burst)
                        .arg(format!("{:?}", share.rate))
                        .arg(share.size)
                        .arg(share.until_us);
                },
                Instant::now() + self.timeout,
            )
            .await?;
        let text = match &reply {
            Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            Value::SimpleString(text) => text.clone(),
            other => {
                return Err(StoreError::Script(format!(
                    "unexpected share reply {other:?}"
                )))
            }
        };
        let mut fields = text.split(' ').map(str::parse::<u64>);
        match (fields.next(), fields.next()) {
            (Some(Ok(level)), Some(Ok(now))) => Ok((crate::base::rate::count_f64(level), now)),
            _ => Err(StoreError::Script(format!(
                "unexpected share reply {text:?}"
            ))),
        }
    }
}
