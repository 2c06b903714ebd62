//! `tollgate top` as a person sees it: two real instances sharing a real redis-server deny
//! some keys; the view runs in a detached tmux session of fixed size, its screen is read back
//! with `capture-pane`, and `q` quits back to the shell.

use std::process::{Command, Output};
use std::time::Duration;

use crate::support::fixtures::PER_IP_AND_PER_KEY_PER_MINUTE;
use crate::support::{redis_config, wait_until, RedisServer, Tollgate};

fn tmux(args: &[&str]) -> Output {
    Command::new("tmux").args(args).output().expect("run tmux")
}

/// A tmux session on its own server socket, killed on drop. One socket per session, not per
/// process: tests run in parallel, and one's `kill-server` must not end another's view.
struct Session {
    socket: String,
}

static SESSIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Session {
    fn start(width: u16, height: u16) -> Session {
        let n = SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let socket = format!("tollgate-top-{}-{n}", std::process::id());
        let session = Session { socket };
        let (w, h) = (width.to_string(), height.to_string());
        let out = session.run(&["new-session", "-d", "-s", "top", "-x", &w, "-y", &h, "sh"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        session
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut all = vec!["-L", self.socket.as_str(), "-f", "/dev/null"];
        all.extend_from_slice(args);
        tmux(&all)
    }

    fn type_line(&self, line: &str) {
        self.run(&["send-keys", "-t", "top", "-l", line]);
        self.run(&["send-keys", "-t", "top", "Enter"]);
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

fn deny(tollgate: &Tollgate, ip: &str, api_key: Option<&str>, times: usize) {
    let mut client = tollgate.client();
    let mut headers = vec![("X-Forwarded-For", ip)];
    headers.extend(api_key.map(|key| ("X-Api-Key", key)));
    for _ in 0..times {
        client.get("/check", &headers).expect("check answered");
    }
}

#[test]
fn top_merges_two_instances_on_screen_and_quits_on_q() {
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("skipped: tmux is not installed (scripts/test.sh installs it)");
        return;
    }
    let redis = RedisServer::start();
    let config = redis_config(&redis, "", PER_IP_AND_PER_KEY_PER_MINUTE);
    let a = Tollgate::start(&config);
    let b = Tollgate::start(&config);
    // 203.0.113.9 floods both instances; 198.51.100.7 only one; an API key from fresh IPs.
    deny(&a, "203.0.113.9", None, 30);
    deny(&b, "203.0.113.9", None, 30);
    deny(&a, "198.51.100.7", None, 11);
    for i in 0..5 {
        deny(&b, &format!("192.0.2.{i}"), Some("sk_live_flood"), 1);
    }

    let session = Session::start(100, 20);
    let binary = env!("CARGO_BIN_EXE_tollgate");
    session.type_line(&format!(
        "{binary} top --admin http://{} --admin {}; echo top-exited-$?",
        a.admin, b.admin
    ));
    let mut screen = String::new();
    let drawn = wait_until(Duration::from_secs(10), || {
        screen = session.screen();
        screen.contains("2/2 instance(s)") && screen.contains("per-key")
    });
    assert!(drawn, "the view never showed both instances:\n{screen}");
    let rows: Vec<&str> = screen
        .lines()
        .skip_while(|line| !line.starts_with("KEY"))
        .skip(1)
        .filter(|line| !line.trim().is_empty())
        .collect();
    // Merged over both instances (one bucket in Redis, one allowed check): the flooding
    // address is first with 59 of the 69 per-ip denials.
    assert!(rows[0].starts_with("203.0.113.9 "), "{screen}");
    assert!(
        rows[0].contains("per-ip") && rows[0].contains("85.5%"),
        "{screen}"
    );
    assert!(rows[1].starts_with("198.51.100.7 "), "{screen}");
    // Without the token, the API key shows as a fingerprint.
    assert!(
        rows.iter()
            .any(|r| r.contains("per-key") && r.contains("100.0%")),
        "{screen}"
    );
    assert!(!screen.contains("sk_live_flood"), "{screen}");

    // Still refreshing a second later; then q quits and the shell is back.
    std::thread::sleep(Duration::from_millis(1500));
    let later = session.screen();
    assert!(later.contains("2/2 instance(s)"), "{later}");
    session.run(&["send-keys", "-t", "top", "q"]);
    let back = wait_until(Duration::from_secs(5), || {
        screen = session.screen();
        screen.contains("top-exited-0")
    });
    assert!(back, "q did not quit back to the shell:\n{screen}");
    assert!(
        !screen.contains("instance(s) answering"),
        "the view was left on screen:\n{screen}"
    );
}

#[test]
fn top_shows_an_unreachable_instance_instead_of_failing() {
    if Command::new("tmux").arg("-V").output().is_err() {
        eprintln!("skipped: tmux is not installed (scripts/test.sh installs it)");
        return;
    }
    let dead = format!("127.0.0.1:{}", crate::support::free_port());
    let session = Session::start(100, 12);
    session.type_line(&format!(
        "{} top --admin http://{dead}; echo top-exited-$?",
        env!("CARGO_BIN_EXE_tollgate")
    ));
    let mut screen = String::new();
    let shown = wait_until(Duration::from_secs(10), || {
        screen = session.screen();
        screen.contains(&format!("unreachable: http://{dead}"))
    });
    assert!(shown, "{screen}");
    assert!(screen.contains("0/1 instance(s)"), "{screen}");
    session.run(&["send-keys", "-t", "top", "q"]);
    assert!(
        wait_until(Duration::from_secs(5), || session
            .screen()
            .contains("top-exited-0")),
        "{}",
        session.screen()
    );
}
