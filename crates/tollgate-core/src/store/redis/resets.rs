//! The reset channel: `DELETE /v1/buckets` deletes a key and publishes it on
//! `<key_prefix>:resets` in one script (`lua/reset.lua`); every instance keeps one subscriber
//! connection and makes its deny cache forget each key it hears of, before its next check.
//!
//! One node is enough to listen to: a single node or the Sentinel-named master hears every
//! publish made to it, and a Redis Cluster forwards every `PUBLISH` to all its nodes, so any
//! one of them will do. A lost connection is re-established with capped backoff
//! (`reset_first_backoff` doubled up to `reset_max_backoff`, see [`Timings`]); when the
//! subscription is back, resets may have been missed meanwhile, so everything cached is
//! forgotten ([`Heard::Everything`]).

use std::time::Duration;

use futures_util::StreamExt;
use redis::sentinel::SentinelClient;
use redis::{Client, RedisResult, TlsCertificates};

use super::connection::{client, sentinel_client};
use super::Topology;
use crate::base::timings::Timings;
use crate::store::StoreError;

/// A connect or a ping that takes longer counts as lost (a silent network drops no socket).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the channel tells an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// This key was reset.
    Reset(String),
    /// Listening (re)started: resets may have gone unheard, forget every cached denial.
    Everything,
}

/// Where to subscribe: node clients tried in turn, or the master Sentinel names.
pub enum ResetSource {
    Nodes(Vec<Client>),
    Sentinel { sentinel: Box<SentinelClient> },
}

impl ResetSource {
    /// The nodes of the configured topology (a Cluster: its seeds).
    pub fn of(
        topology: &Topology<'_>,
        tls: Option<&TlsCertificates>,
    ) -> Result<ResetSource, StoreError> {
        let invalid = |key: &str, e: redis::RedisError| {
            StoreError::Other(format!("invalid {key} ({:?})", e.kind()))
        };
        match topology {
            Topology::Single { url } => Ok(ResetSource::Nodes(vec![
                client(*url, tls).map_err(|e| invalid("store.url", e))?
            ])),
            Topology::Cluster { seeds } => seeds
                .iter()
                .map(|seed| client(seed.as_str(), tls).map_err(|e| invalid("store.cluster", e)))
                .collect::<Result<_, _>>()
                .map(ResetSource::Nodes),
            Topology::Sentinel { sentinel, url } => {
                let sentinel = sentinel_client(sentinel, url, tls, None)?;
                Ok(ResetSource::Sentinel {
                    sentinel: Box::new(sentinel),
                })
            }
        }
    }

    /// The node to listen to on attempt `attempt` (a Cluster's seeds in turn).
    async fn client(&mut self, attempt: usize) -> RedisResult<Client> {
        match self {
            ResetSource::Nodes(clients) => Ok(clients[attempt % clients.len()].clone()),
            ResetSource::Sentinel { sentinel } => sentinel.async_get_client().await,
        }
    }
}

/// Listens on `channel` for as long as the process runs, telling `heard` of every reset; a
/// quiet subscription is pinged every `reset_ping_every` of `timings`.
pub async fn listen(
    mut source: ResetSource,
    channel: String,
    timings: Timings,
    heard: impl Fn(Heard),
) {
    let mut backoff = timings.reset_first_backoff;
    let mut lost = false;
    for attempt in 0.. {
        match subscribe(&mut source, attempt, &channel).await {
            Ok(pubsub) => {
                // Not at the first subscription: the cache is nearly empty then, and clearing
                // it would send a flood's next check to the store for nothing. A reset in the
                // moment before is covered by the cache's own cap on how long it denies.
                if lost {
                    log::info!("reset channel {channel:?} is back; cached denials dropped");
                    heard(Heard::Everything);
                }
                backoff = timings.reset_first_backoff;
                follow(pubsub, timings.reset_ping_every, &heard).await;
                if !lost {
                    log::warn!("lost the reset channel {channel:?}; reconnecting");
                }
                lost = true;
            }
            Err(error) => {
                log::debug!("cannot subscribe to {channel:?}: {error}");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(timings.reset_max_backoff);
    }
}

async fn subscribe(
    source: &mut ResetSource,
    attempt: usize,
    channel: &str,
) -> RedisResult<redis::aio::PubSub> {
    let timed_out = || redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
    let connect = async {
        let client = source.client(attempt).await?;
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(channel).await?;
        Ok(pubsub)
    };
    tokio::time::timeout(ATTEMPT_TIMEOUT, connect)
        .await
        .unwrap_or_else(|_| Err(timed_out()))
}

/// Hands every message to `heard` until the connection ends or stops answering the pings
/// sent every `ping_every`.
async fn follow(pubsub: redis::aio::PubSub, ping_every: Duration, heard: &impl Fn(Heard)) {
    let (mut sink, mut messages) = pubsub.split();
    let mut ping = tokio::time::interval(ping_every);
    ping.tick().await;
    loop {
        tokio::select! {
            message = messages.next() => match message {
                // A payload that is not UTF-8 is no key tollgate wrote: nothing to forget.
                Some(message) => {
                    if let Ok(key) = std::str::from_utf8(message.get_payload_bytes()) {
                        heard(Heard::Reset(key.to_string()));
                    }
                }
                None => return,
            },
            _ = ping.tick() => {
                // Any answer will do: a subscribed RESP2 connection answers PING with an
                // array, ["pong", ""], not the usual "PONG".
                let pong = sink.ping::<redis::Value>();
                let alive = tokio::time::timeout(ATTEMPT_TIMEOUT, pong).await;
                if !matches!(alive, Ok(Ok(_))) {
                    return;
                }
            }
        }
    }
}
