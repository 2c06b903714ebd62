//! A link between regions: a loopback TCP proxy that delays every chunk by a fixed time each
//! way (as [`super::latency::LatencyProxy`] does: the same relay), to the first of several
//! upstreams that accepts (two home replicas: a new connection after one died reaches the
//! other), and that can be cut (every connection reset, new ones refused) and restored.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The proxy; stopped on drop.
pub struct Link {
    pub port: u16,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Link {
    /// A link `one_way` long each way to the first of `upstreams` that accepts.
    pub fn start(upstreams: Vec<u16>, one_way: Duration) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the link");
        let port = listener.local_addr().expect("link addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let acceptor = {
            let (cut, stop, connections) = (cut.clone(), stop.clone(), connections.clone());
            let lateness = Arc::new(AtomicU64::new(0));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        // A cut link takes the connection and drops it: the client sees it
                        // reset, as across a partition that a firewall answers.
                        Ok(_) if cut.load(Ordering::SeqCst) => {}
                        Ok((client, _)) => {
                            let server = upstreams
                                .iter()
                                .find_map(|port| TcpStream::connect(("127.0.0.1", *port)).ok());
                            if let Some(server) = server {
                                super::latency::relay(
                                    client,
                                    server,
                                    one_way,
                                    &connections,
                                    &lateness,
                                );
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            })
        };
        Link {
            port,
            cut,
            stop,
            connections,
            acceptor: Some(acceptor),
        }
    }

    /// `host:port` of the link's near end.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Cuts the link: every connection through it is reset and new ones are refused.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.reset();
    }

    /// Restores a cut link: new connections go through again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Resets every connection through the link (the next call must reconnect).
    pub fn reset(&self) {
        for stream in self.connections.lock().unwrap().drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.reset();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}
