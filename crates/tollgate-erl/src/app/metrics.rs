//! envoyproxy/ratelimit's metrics leaving the process: the Prometheus listener of
//! `envoy.metrics.prometheus_listen` (its port and path, as Envoy Gateway scrapes them) and the
//! metrics duty, which every `flush_interval_ms` sends the counters' increases to statsd (when
//! `envoy.metrics.statsd` is set) and then drops the idle stats keys ([`ErlStats::sweep`]).
//!
//! statsd is sent to whatever answers: over UDP nothing is known of the receiver, and over
//! TCP a refused or broken connection drops that flush and is tried again at the next one
//! (logged once per outage), as envoyproxy/ratelimit's statsd client does.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::CONTENT_TYPE;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

use tollgate_core::erl::config::metrics::{ErlMetricsConfig, StatsdProtocol};
use tollgate_core::erl::observe::ErlStats;

/// What fits one datagram without fragmenting on a common path (statsd clients' choice).
const DATAGRAM: usize = 1432;
/// How long a TCP connection to statsd may take before the flush is dropped.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a flush may wait on a statsd that does not read before the connection is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The Prometheus listener, bound before the runtime starts (tests bind port 0).
pub struct PrometheusListener {
    pub listener: TcpListener,
    pub path: String,
}

/// Serves the series on `listener.path` (`GET`); every other request is a 404.
pub fn prometheus_server(
    listener: PrometheusListener,
    stats: Arc<ErlStats>,
    shutdown_timeout: u64,
) -> std::io::Result<actix_web::dev::Server> {
    log::info!(
        "serving envoyproxy/ratelimit's metrics on {}{}",
        listener.listener.local_addr()?,
        listener.path
    );
    let path = Arc::<str>::from(listener.path);
    Ok(HttpServer::new(move || {
        App::new()
            .app_data(web::Data::from(Arc::clone(&stats)))
            .app_data(web::Data::new(Arc::clone(&path)))
            .default_service(web::to(exposition))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(shutdown_timeout)
    .listen(listener.listener)?
    .run())
}

async fn exposition(
    request: HttpRequest,
    stats: web::Data<ErlStats>,
    path: web::Data<Arc<str>>,
) -> HttpResponse {
    if request.path() != &***path || request.method() != actix_web::http::Method::GET {
        return HttpResponse::NotFound().finish();
    }
    HttpResponse::Ok()
        .insert_header((CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8"))
        .body(stats.render())
}

/// Starts the metrics duty when the metrics are kept.
pub fn spawn_duty(metrics: &ErlMetricsConfig, stats: Option<&Arc<ErlStats>>) {
    let Some(stats) = stats else {
        return;
    };
    let every = Duration::from_millis(metrics.flush_interval_ms);
    let sender = metrics.statsd.as_ref().map(|address| {
        log::info!(
            "sending envoyproxy/ratelimit's metrics to statsd at {address} ({:?}) every {} ms",
            metrics.statsd_protocol,
            metrics.flush_interval_ms
        );
        Sender {
            address: address.clone(),
            protocol: metrics.statsd_protocol,
            tcp: None,
            udp: None,
            failing: false,
        }
    });
    actix_web::rt::spawn(duty(Arc::clone(stats), sender, every));
}

/// Every `every`: sends what the counters gained since the last flush (with a `sender`), then
/// drops the idle keys: after the flush, so a dropped key's last increase was sent.
async fn duty(stats: Arc<ErlStats>, mut sender: Option<Sender>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Some(sender) = &mut sender {
            flush(&stats, sender).await;
        }
        stats.sweep();
    }
}

/// Sends what the counters gained since the last flush.
async fn flush(stats: &ErlStats, sender: &mut Sender) {
    let protocol = sender.protocol;
    // Lines end with a newline; a datagram holds whole lines only.
    let mut packets: Vec<String> = Vec::new();
    stats.statsd_lines(|line| {
        let fits = packets.last().is_some_and(|packet| {
            protocol == StatsdProtocol::Tcp || packet.len() + line.len() < DATAGRAM
        });
        if !fits {
            packets.push(String::new());
        }
        if let Some(packet) = packets.last_mut() {
            packet.push_str(line);
            packet.push('\n');
        }
    });
    if packets.is_empty() {
        return;
    }
    match sender.send(&packets).await {
        Ok(()) if sender.failing => {
            log::info!("statsd: {} takes the metrics again", sender.address);
            sender.failing = false;
        }
        Ok(()) => {}
        Err(error) if !sender.failing => {
            log::warn!(
                "statsd: cannot send to {}, dropping the metrics until it can: {error}",
                sender.address
            );
            sender.failing = true;
        }
        Err(_) => {}
    }
}

struct Sender {
    address: String,
    protocol: StatsdProtocol,
    tcp: Option<TcpStream>,
    udp: Option<UdpSocket>,
    failing: bool,
}

impl Sender {
    async fn send(&mut self, packets: &[String]) -> std::io::Result<()> {
        match self.protocol {
            StatsdProtocol::Tcp => {
                if self.tcp.is_none() {
                    let connect = TcpStream::connect(self.address.as_str());
                    let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
                        .await
                        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
                    self.tcp = Some(stream);
                }
                let Some(stream) = &mut self.tcp else {
                    return Ok(());
                };
                let written = tokio::time::timeout(WRITE_TIMEOUT, async {
                    for packet in packets {
                        stream.write_all(packet.as_bytes()).await?;
                    }
                    Ok(())
                })
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
                if written.is_err() {
                    self.tcp = None;
                }
                written
            }
            StatsdProtocol::Udp => {
                let target = tokio::net::lookup_host(self.address.as_str())
                    .await?
                    .next()
                    .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
                let socket = match self.udp.take() {
                    Some(socket) if socket.local_addr()?.is_ipv4() == target.is_ipv4() => socket,
                    _ if target.is_ipv4() => UdpSocket::bind("0.0.0.0:0").await?,
                    _ => UdpSocket::bind("[::]:0").await?,
                };
                let sent = async {
                    for packet in packets {
                        socket.send_to(packet.as_bytes(), target).await?;
                    }
                    Ok(())
                }
                .await;
                self.udp = Some(socket);
                sent
            }
        }
    }
}
