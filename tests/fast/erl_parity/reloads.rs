//! Reloads that get stuck or race a change: SIGTERM still stops, the next reload reads
//! the change.

use super::*;

/// A named pipe standing in for `admin_token_file`, which a reload reads before and after the
/// config directory: fed while `feeding`, so that a test can hold a reload at that point (the reader
/// waits for a writer) and let it go.
struct TokenPipe {
    path: std::path::PathBuf,
    feeding: std::sync::Arc<std::sync::atomic::AtomicBool>,
    idle: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    feeder: Option<std::thread::JoinHandle<()>>,
}

const TOKEN: &[u8] = b"s3cret-admin-token-0123";

impl TokenPipe {
    fn new(dir: &Path) -> TokenPipe {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let path = dir.join("token");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let (feeding, idle, stop) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let feeder = {
            let (path, feeding, idle, stop) =
                (path.clone(), feeding.clone(), idle.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if !feeding.load(Ordering::SeqCst) {
                        idle.store(true, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    match Self::open_for_a_reader(&path) {
                        Some(mut reader_waiting) => {
                            use std::io::Write;
                            let _ = reader_waiting.write_all(TOKEN);
                        }
                        None => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        TokenPipe {
            path,
            feeding,
            idle,
            stop,
            feeder: Some(feeder),
        }
    }

    /// The pipe opened for writing when a reader has it open; `None` at once otherwise.
    fn open_for_a_reader(path: &Path) -> Option<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .ok()
    }

    /// Stops feeding: from now on a read waits.
    fn hold(&self) {
        use std::sync::atomic::Ordering;
        self.feeding.store(false, Ordering::SeqCst);
        while !self.idle.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until a read is waiting (a reload got there), and returns its writer.
    fn waiting_reader(&self) -> std::fs::File {
        let mut writer = None;
        assert!(
            wait_until(Duration::from_secs(10), || {
                writer = Self::open_for_a_reader(&self.path);
                writer.is_some()
            }),
            "no reload came to read the token"
        );
        writer.unwrap()
    }

    /// Starts watching the pipe; the function returned waits until a reader has closed it
    /// since (so that the next reader to open it is a new read).
    fn watch_reader_closes(&self) -> impl FnOnce() {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: a system call without pointers; the descriptor is this function's.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1");
        let path = std::ffi::CString::new(self.path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `path` is NUL-terminated and outlives the call.
        let watch = unsafe { libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_CLOSE_NOWRITE) };
        assert!(watch >= 0, "inotify_add_watch");
        move || {
            // Only closes by a reader are watched: any event is one.
            let mut buffer = [0u8; 4096];
            // SAFETY: reads at most the buffer's length into it.
            let read = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
            // SAFETY: closes the descriptor opened above, used no more.
            unsafe { libc::close(fd) };
            assert!(read > 0, "no close of the pipe was seen");
        }
    }

    fn release(&self) {
        use std::sync::atomic::Ordering;
        self.idle.store(false, Ordering::SeqCst);
        self.feeding.store(true, Ordering::SeqCst);
    }

    fn config_line(&self) -> String {
        format!("admin_token_file = {:?}\n", self.path.display().to_string())
    }
}

impl Drop for TokenPipe {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(feeder) = self.feeder.take() {
            let _ = feeder.join();
        }
    }
}

/// SIGTERM while a reload is stuck (here reading an `admin_token_file` that is a pipe nobody
/// writes to any more): the instance still stops, because a reload never runs on the thread
/// that hears signals. Before, it never would.
#[test]
fn sigterm_stops_the_instance_while_a_reload_is_stuck() {
    let dir = TempDir::new("stuck-reload");
    let pipe = TokenPipe::new(dir.path());
    let mut tollgate = Tollgate::start(&pipe.config_line());
    pipe.hold();
    tollgate.signal("HUP");
    drop(pipe.waiting_reader());
    // The writer closed without writing: the reload read an empty token and was refused.
    // Hold the next one for good.
    tollgate.signal("HUP");
    let stuck = pipe.waiting_reader();
    tollgate.signal("TERM");
    assert_eq!(
        tollgate.wait_exit(Duration::from_secs(30)),
        Some(0),
        "SIGTERM was not heard during the reload"
    );
    drop(stuck);
}

/// A file changed while the directory's reload was reading it is read by the next one: the
/// reload remembers the directory as it was before it read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_during_a_reload_is_read_by_the_next_one() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("reload-race");
    let rules = dir.path().join("config");
    write(&rules.join("a.yaml"), &per_minute("d", "k", 1));
    let pipe = TokenPipe::new(dir.path());
    // Top-level keys come before the tables `redis_config` writes.
    let toml = format!("[envoy]\nconfig_dir = {:?}\n", rules.display().to_string());
    let config = format!("{}{}", pipe.config_line(), redis_config(&redis, "", &toml));
    let (_tollgate, addr) = grpc::tollgate_with_env(&config, &[crate::support::SHORT_TIMINGS]);
    let mut client = grpc::client(addr).await;
    let served = |r: &RateLimitResponse| requests_per_unit(r);
    let ask_once = |client: &mut grpc::Client| {
        let mut client = client.clone();
        async move { ask(&mut client, request("d", vec![descriptor(&[("k", "x")])])).await }
    };
    assert_eq!(served(&ask_once(&mut client).await), 1);

    use std::io::Write;
    pipe.hold();
    let closed_by_a_reader = pipe.watch_reader_closes();
    write(&rules.join("a.yaml"), &per_minute("d", "k", 22));
    // A reload reads the token as it loads the config, then the directory, then the token
    // again as it builds the rules: let the first read through, hold the second.
    pipe.waiting_reader().write_all(TOKEN).unwrap();
    closed_by_a_reader();
    let mut second = pipe.waiting_reader();
    // The reload has read 22; meanwhile the file changes again.
    write(&rules.join("a.yaml"), &per_minute("d", "k", 333));
    second.write_all(TOKEN).unwrap();
    drop(second);
    pipe.release();
    let mut now = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while now != 333 && std::time::Instant::now() < deadline {
        tokio::time::sleep(crate::support::short_timings().watch_every / 5).await;
        now = served(&ask_once(&mut client).await);
    }
    assert_eq!(now, 333, "the change made during the reload was never read");
}
