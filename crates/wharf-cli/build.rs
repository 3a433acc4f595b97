//! Release builds of `wharf` place the functions it runs at startup and on its request paths
//! together (see `scripts/order-symbols.sh`): code next to hot code stays resident although
//! it never runs, so grouping the hot code keeps the rest out of RSS (about 2.5 MiB less).
//!
//! Only where the linker is known to take the list: x86_64 Linux with rustc's own lld (the
//! default since Rust 1.90). `WHARF_NO_SYMBOL_ORDERING=1` turns it off.

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    let list = Path::new("link/hot-symbols.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    println!("cargo:rerun-if-env-changed=WHARF_NO_SYMBOL_ORDERING");
    if env::var_os("WHARF_NO_SYMBOL_ORDERING").is_some_and(|v| v == "1")
        || env::var("PROFILE").as_deref() != Ok("release")
        || env::var("TARGET").as_deref() != Ok("x86_64-unknown-linux-gnu")
        || !rustc_links_with_lld()
        || !list.exists()
    {
        return;
    }
    let Ok(dir) = env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let path = Path::new(&dir).join(list);
    println!(
        "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
        path.display()
    );
    // Names the build does not define (another toolchain's hashes) are skipped quietly.
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
}

/// Whether rustc is 1.90 or later, whose x86_64 Linux target links with its own lld.
fn rustc_links_with_lld() -> bool {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(out) = Command::new(rustc).arg("--version").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (1, 90)
}
