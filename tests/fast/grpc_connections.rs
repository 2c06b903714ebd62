//! The gRPC listener's connections are bounded: a silent one (no HTTP/2 preface) is closed
//! after `grpc_first_bytes_within`, and past `grpc_max_connections` a new one is closed at
//! once. Before, silent connections were held forever, and enough of them made `accept` fail
//! on every listener, `/check` included.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use crate::support::grpc;
use crate::support::{short_timings, wait_until, SHORT_TIMINGS};

fn config(max_connections: u32) -> String {
    format!(
        "grpc_max_connections = {max_connections}\n[store]\nbackend = \"memory\"\n\n\
         [[limits]]\nname = \"per-ip\"\nrate = 1000\nburst = 1000\nkey = [\"ip\"]\n"
    )
}

/// Sets the soft and hard descriptor limits of process `pid`.
fn set_descriptor_limit(pid: u32, soft: &str, hard: &str) {
    let status = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={soft}:{hard}"))
        .status()
        .expect("run prlimit");
    assert!(status.success(), "prlimit --pid {pid} failed");
}

/// This test process's hard descriptor limit, to hold many connections itself.
fn raise_own_limit() {
    let hard = Command::new("prlimit")
        .args(["--nofile", "--output=HARD", "--noheadings", "--raw"])
        .arg(format!("--pid={}", std::process::id()))
        .output()
        .expect("run prlimit");
    let hard = String::from_utf8_lossy(&hard.stdout).trim().to_string();
    set_descriptor_limit(std::process::id(), &hard, &hard);
}

/// Whether the server has closed `stream`: a read sees its end (or a reset) within `within`.
fn closed_by_server(stream: &TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 256];
    let mut reader = stream;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

fn health_answers(addr: SocketAddr) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let Ok(endpoint) = tonic::transport::Endpoint::from_shared(format!("http://{addr}")) else {
            return false;
        };
        let Ok(channel) = endpoint
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
        else {
            return false;
        };
        let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
        let request = tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        };
        tokio::time::timeout(Duration::from_secs(2), client.check(request))
            .await
            .is_ok_and(|answer| answer.is_ok())
    })
}

/// `/check` on a fresh connection, answered within `within` (a starved `accept` leaves it
/// unanswered).
fn check_answers(addr: SocketAddr, within: Duration) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, within) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(within));
    if stream
        .write_all(b"GET /check HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).is_ok() && answer.starts_with(b"HTTP/1.1 200")
}

/// 1,100 silent connections against a process limited to 1,024 descriptors: past the cap
/// they are closed at once, so `/check` is still answered while the rest wait out the
/// preface wait (10 s here: production timings). Without the cap, `accept` failed on every
/// listener until the silent connections went.
#[test]
fn silent_connections_past_the_cap_never_starve_check() {
    raise_own_limit();
    let (tollgate, grpc_addr) = grpc::tollgate(&config(500));
    // Lowered after start: tollgate raises its soft limit to the hard one when it starts.
    set_descriptor_limit(tollgate.pid(), "1024", "1024");
    let silent: Vec<TcpStream> = (0..1_100)
        .map(|_| TcpStream::connect(grpc_addr).expect("connect"))
        .collect();
    // Well inside the 10 s the held ones may stay silent.
    let within = Duration::from_secs(4);
    for _ in 0..3 {
        assert!(
            check_answers(tollgate.addr, within),
            "/check answers beside 1,100 silent gRPC connections"
        );
    }
    drop(silent);
    assert!(
        wait_until(Duration::from_secs(5), || health_answers(grpc_addr)),
        "the gRPC listener serves again"
    );
}

/// A connection that sends no HTTP/2 preface is closed after `grpc_first_bytes_within`; one
/// that sent it is served.
#[test]
fn a_connection_without_the_preface_is_closed_after_the_wait() {
    let (_tollgate, grpc_addr) = grpc::tollgate_with_env(&config(500), &[SHORT_TIMINGS]);
    let silent: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(grpc_addr).expect("connect"))
        .collect();
    let mut speaking = TcpStream::connect(grpc_addr).expect("connect");
    speaking
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .expect("send the preface");
    let within = short_timings().grpc_first_bytes_within;
    // The wait, and as long again for a busy machine to get round to closing them.
    std::thread::sleep(within * 2);
    let still_open = silent
        .iter()
        .filter(|stream| !closed_by_server(stream, Duration::from_millis(50)))
        .count();
    assert_eq!(
        still_open, 0,
        "silent connections are closed after {within:?}"
    );
    assert!(
        !closed_by_server(&speaking, Duration::from_millis(200)),
        "a connection that sent the preface is served"
    );
}

/// At the cap a new connection is closed at once; once connections close, new ones are
/// served again.
#[test]
fn past_the_cap_a_connection_is_closed_at_once_and_served_again_below_it() {
    // Production timings: the two held connections stay silent for 10 s without being closed.
    let (tollgate, grpc_addr) = grpc::tollgate(&config(2));
    let held: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(grpc_addr).expect("connect"))
        .collect();
    // The acceptor takes connections in order: give it the two before the third.
    std::thread::sleep(Duration::from_millis(200));
    let third = TcpStream::connect(grpc_addr).expect("the kernel accepts");
    assert!(
        closed_by_server(&third, Duration::from_secs(2)),
        "a connection past the cap is closed at once"
    );
    assert!(!health_answers(grpc_addr), "no room for a gRPC client");
    assert_eq!(tollgate.check(&[]).status, 200, "/check is not concerned");
    drop(held);
    assert!(
        wait_until(Duration::from_secs(5), || health_answers(grpc_addr)),
        "served again once the held connections closed"
    );
}
