//! A real statsd daemon (npm `statsd`, `npm install -g statsd`) listening on loopback, UDP and
//! TCP each on a free port, with its console backend writing every flush to a log file that
//! tests read back. Killed by its own pid on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, require_binary, wait_until, TempDir};

pub struct Statsd {
    pub udp_port: u16,
    pub tcp_port: u16,
    child: Child,
    log: PathBuf,
    _dir: TempDir,
}

impl Statsd {
    pub fn start() -> Statsd {
        let dir = TempDir::new("statsd");
        let (udp_port, tcp_port, admin_port) = (free_port(), free_port(), free_port());
        // Every counter of every flush, one `'name': value` per line once the object is long.
        let config = format!(
            "{{ mgmt_address: \"127.0.0.1\", mgmt_port: {admin_port}, flushInterval: 200,
               servers: [
                 {{ server: \"./servers/udp\", address: \"127.0.0.1\", port: {udp_port} }},
                 {{ server: \"./servers/tcp\", address: \"127.0.0.1\", port: {tcp_port} }}
               ],
               backends: [\"./backends/console\"], deleteIdleStats: true }}\n"
        );
        let config_path = dir.write("config.js", &config);
        let log = dir.path().join("statsd.log");
        let out = std::fs::File::create(&log).expect("create statsd.log");
        let child = Command::new(require_binary("statsd"))
            .arg(&config_path)
            .stdout(Stdio::from(out.try_clone().expect("log file")))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("start statsd");
        let statsd = Statsd {
            udp_port,
            tcp_port,
            child,
            log,
            _dir: dir,
        };
        // Its own counters appear at the first flush, once both servers listen.
        let up = wait_until(Duration::from_secs(10), || {
            statsd.log_text().contains("statsd.metrics_received")
        });
        assert!(up, "statsd did not flush: {}", statsd.log_text());
        statsd
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A counter's value added up over every flush so far (each flush shows the increase
    /// since the one before).
    pub fn counter(&self, name: &str) -> u64 {
        let quoted = format!("'{name}': ");
        let log = self.log_text();
        // Each flush prints `counters: { ... }` (then `counter_rates`, per second: not these).
        log.split("counters: {")
            .skip(1)
            .filter_map(|flush| {
                let counters = &flush[..flush.find('}')?];
                let rest = &counters[counters.find(&quoted)? + quoted.len()..];
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u64>().ok()
            })
            .sum()
    }
}

impl Drop for Statsd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
