//! A slow but healthy link: a loopback TCP proxy that delays every chunk by a fixed time per
//! direction. Std only, so `examples/latency_proxy.rs` (which `bench/distance.sh` runs between
//! tollgate and Redis) includes this same file rather than a second implementation.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A loopback TCP proxy that delays every chunk by a fixed time per direction, like a Redis
/// host `one_way` away: a round trip through it costs twice that. Each direction has a reader
/// that stamps chunks as they arrive and a writer that sends each when its time comes, so
/// chunks in flight overlap as on a real link. Its own sockets run with `TCP_NODELAY`, so the
/// proxy adds no batching of its own.
pub struct LatencyProxy {
    pub port: u16,
    /// The most a chunk was delivered after its due time, in µs: on a loaded machine the
    /// proxy's own threads wake late, and the link was then slower than asked.
    lateness_us: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl LatencyProxy {
    pub fn start(upstream: u16, one_way: Duration) -> LatencyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind latency proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let lateness_us = Arc::new(AtomicU64::new(0));
        let acceptor = {
            let (stop, connections) = (stop.clone(), connections.clone());
            let lateness = lateness_us.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                                continue;
                            };
                            relay(client, server, one_way, &connections, &lateness);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            })
        };
        LatencyProxy {
            port,
            lateness_us,
            stop,
            connections,
            acceptor: Some(acceptor),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The worst lateness since the last call (see the field), and starts counting afresh.
    pub fn take_lateness(&self) -> Duration {
        Duration::from_micros(self.lateness_us.swap(0, Ordering::SeqCst))
    }

    /// Resets every connection through the proxy (the next call must reconnect).
    pub fn cut(&self) {
        for stream in self.connections.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cut();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// Relays `client` and `server` both ways, each chunk `one_way` late; both sockets are kept
/// in `held` (to be reset), the worst lateness in `lateness`.
pub fn relay(
    client: TcpStream,
    server: TcpStream,
    one_way: Duration,
    held: &Mutex<Vec<TcpStream>>,
    lateness: &Arc<AtomicU64>,
) {
    let _ = client.set_nonblocking(false);
    for stream in [&client, &server] {
        let _ = stream.set_nodelay(true);
        held.lock()
            .unwrap()
            .push(stream.try_clone().expect("clone socket"));
    }
    for (from, to) in [
        (
            client.try_clone().expect("clone"),
            server.try_clone().expect("clone"),
        ),
        (server, client),
    ] {
        let (send, receive) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
        std::thread::spawn(move || delayed_reader(from, send));
        let lateness = lateness.clone();
        std::thread::spawn(move || delayed_writer(to, receive, one_way, &lateness));
    }
}

/// Stamps each chunk with its arrival; an empty chunk means the sender closed.
fn delayed_reader(mut from: TcpStream, send: std::sync::mpsc::Sender<(Instant, Vec<u8>)>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(n) if n > 0 => {
                if send.send((Instant::now(), buf[..n].to_vec())).is_err() {
                    return;
                }
            }
            _ => {
                let _ = send.send((Instant::now(), Vec::new()));
                return;
            }
        }
    }
}

fn delayed_writer(
    mut to: TcpStream,
    receive: std::sync::mpsc::Receiver<(Instant, Vec<u8>)>,
    one_way: Duration,
    lateness: &AtomicU64,
) {
    while let Ok((arrived, chunk)) = receive.recv() {
        let due = arrived + one_way;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let late = Instant::now().saturating_duration_since(due);
        lateness.fetch_max(late.as_micros() as u64, Ordering::SeqCst);
        if chunk.is_empty() || to.write_all(&chunk).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}
