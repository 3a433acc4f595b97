//! `wharf`: run the reference MCP server over Streamable HTTP or stdio.

mod serve;

use clap::{Parser, Subcommand};

/// Wharf: stateless MCP (2026-07-28) servers for replicas behind a load balancer.
#[derive(Debug, Parser)]
#[command(name = "wharf", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the reference server.
    Serve(serve::ServeArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args),
    }
}
