//! The `tollgate` binary: parse the command line, load the config, run or validate.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tollgate::app::server::{self, Listeners};
use tollgate::state::StartError;
use tollgate_core::config::{Config, ConfigError};
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::policy::Policy;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "Rate-limit sidecar for ingress controllers"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// TOML config file (default: built-in defaults, memory store, 20/s per client IP)
    #[arg(long, global = true, env = "TOLLGATE_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Subcommand, Clone)]
enum Command {
    /// Run the service (the default)
    Serve,
    /// Check the configuration, print the effective limits, exit 0 (or 2 on an error)
    Validate,
    /// Convert another rate limiter's configuration to tollgate TOML on stdout
    #[command(subcommand)]
    Import(Import),
    /// Run an access log against the config offline: what each limit would have denied
    Replay(tollgate::cli::replay::ReplayArgs),
    /// The most denied keys over instances, refreshed every second (q quits)
    Top(tollgate::cli::top_view::TopArgs),
}

#[derive(Subcommand, Clone)]
enum Import {
    /// envoyproxy/ratelimit YAML files (domains, nested descriptors, rate_limit)
    EnvoyRatelimit {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Files of one domain join it (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG=true)
        #[arg(long)]
        merge_domains: bool,
    },
    /// Kubernetes Ingress YAML with ingress-nginx rate-limit annotations
    IngressNginx {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print what to put in front of tollgate for this proxy instead of the TOML
        #[arg(long, value_enum)]
        proxy: Option<tollgate::cli::ingress_nginx::Proxy>,
        /// The controller's --annotations-prefix
        #[arg(long, default_value = tollgate::cli::ingress_nginx::DEFAULT_PREFIX)]
        annotations_prefix: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The redis client logs every reconnect attempt of a Cluster or Sentinel failover at
    // warn (tollgate itself logs the store going down and up once each way), and actix logs
    // every unparseable request at error, which would let any client flood the log.
    let default_filter = "info,redis=error,actix_http::h1::dispatcher=off";
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_filter))
        .init();
    // rediss:// uses rustls; name its crypto provider so that no other crate enabling a second
    // one can leave TLS without a default at the first connection.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(Command::Import(Import::EnvoyRatelimit {
        files,
        merge_domains,
    })) = &cli.command
    {
        return match tollgate::cli::import::envoy_ratelimit(files, *merge_domains) {
            Ok(toml) => {
                print!("{toml}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("tollgate: cannot import {error}");
                ExitCode::from(2)
            }
        };
    }
    if let Some(Command::Import(Import::IngressNginx {
        files,
        proxy,
        annotations_prefix,
    })) = &cli.command
    {
        return tollgate::cli::ingress_nginx::run(files, *proxy, annotations_prefix);
    }
    if let Some(Command::Replay(args)) = &cli.command {
        return tollgate::cli::replay::run(cli.config.as_deref(), args);
    }
    if let Some(Command::Top(args)) = &cli.command {
        return match tollgate::cli::top_view::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("tollgate: top: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let config = match Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(error) => return refuse(&error),
    };
    match cli.command.unwrap_or(Command::Serve) {
        Command::Validate => validate(&config),
        Command::Serve => serve(config, cli.config),
        // Answered above, before any configuration is loaded.
        Command::Import(_) | Command::Top(_) | Command::Replay(_) => ExitCode::SUCCESS,
    }
}

/// One line naming the key, exit code 2.
fn refuse(error: &ConfigError) -> ExitCode {
    eprintln!("tollgate: invalid configuration: {error}");
    ExitCode::from(2)
}

fn validate(config: &Config) -> ExitCode {
    let policy = match Policy::compile(config, &Metrics::new()) {
        Ok(policy) => policy,
        Err(error) => return refuse(&error),
    };
    print!("{}", config.summary());
    for limit in &policy.limits {
        println!(
            "borrowing     {}: {}",
            limit.name,
            limit.borrowing(&config.store)
        );
    }
    for limit in policy.limits.iter().filter(|l| !l.overrides.is_empty()) {
        println!(
            "overrides     {}: {} key(s)",
            limit.name,
            limit.overrides.len()
        );
    }
    ExitCode::SUCCESS
}

fn serve(config: Config, path: Option<PathBuf>) -> ExitCode {
    // Refused before anything is bound: a port in use must not hide a bad limit behind an
    // exit code 1 (the state compiles the policy again, from the same config).
    if let Err(error) = Policy::compile(&config, &Metrics::new()) {
        return refuse(&error);
    }
    let result = Listeners::bind(&config).and_then(|listeners| {
        actix_web::rt::System::new().block_on(server::start(config, path, listeners))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(StartError::Config(error)) => refuse(&error),
        Err(error) => {
            log::error!("{error}");
            ExitCode::FAILURE
        }
    }
}
