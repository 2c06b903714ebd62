//! With `on_error = "local"`, each instance announces itself in Redis and learns how many share
//! it, so the local fallback can enforce its share of each limit.

use actix_web::web;

use crate::state::AppState;
use tollgate_core::store::AnyStore;

/// Keeps this instance's heartbeat in Redis and learns how many instances share it: an
/// announcement every `heartbeat_every`; an instance silent for `instance_ttl` is gone (see
/// [`Timings`](tollgate_core::base::timings::Timings)).
pub async fn count_instances(state: web::Data<AppState>, registry_key: String) {
    let AnyStore::Redis(store) = state.limiter.store() else {
        return;
    };
    let instance = instance_id();
    let timings = state.timings;
    let mut tick = tokio::time::interval(timings.heartbeat_every);
    loop {
        tick.tick().await;
        match store
            .heartbeat(&registry_key, &instance, timings.instance_ttl)
            .await
        {
            Ok(count) if count != state.limiter.instances() => {
                log::info!("{count} tollgate instance(s) share this store");
                state.limiter.set_instances(count);
            }
            Ok(_) => {}
            // Keep the last count: it is what the local fallback needs during an outage.
            Err(error) => log::debug!("instance heartbeat failed: {error}"),
        }
    }
}

/// This process's name among the instances of its store: host, pid and a nonce.
pub fn instance_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{host}-{}-{nanos}", std::process::id())
}
