//! Headless Chromium for tests: Debian's `chromium` driven through `chromedriver` (the W3C
//! WebDriver protocol, via fantoccini), and OCR of its screenshots with `tesseract`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use super::import::unique;

/// `chromedriver`, killed when dropped.
pub(crate) struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn required(binary: &str, package: &str) -> String {
    let path = format!("/usr/bin/{binary}");
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is required for this test: apt-get install {package}"
    );
    path
}

/// Starts chromedriver and a headless Chromium session.
pub(crate) async fn browser() -> (Driver, Client) {
    let driver_bin = required("chromedriver", "chromium-driver");
    let chromium = required("chromium", "chromium");
    let port = super::free_port();
    let driver = Driver(
        Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    );
    let status = format!("http://127.0.0.1:{port}/status");
    let deadline = Instant::now() + Duration::from_secs(20);
    while reqwest::get(&status).await.is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let profile = super::scratch(unique("chromium-profile"));
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=900,1000", "--force-device-scale-factor=1",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let client = ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium session");
    (driver, client)
}

/// The words OCR reads in a PNG screenshot.
pub(crate) fn ocr(png: &[u8], name: &str) -> String {
    let tesseract = required("tesseract", "tesseract-ocr");
    let dir = super::scratch("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.png"));
    std::fs::write(&file, png).unwrap();
    let out = Command::new(tesseract)
        .arg(&file)
        .arg("stdout")
        .output()
        .expect("run tesseract");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) async fn wait_for_url(client: &Client, prefix: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let url = client.current_url().await.unwrap().to_string();
        if url.starts_with(prefix) {
            return url;
        }
        assert!(Instant::now() < deadline, "the browser stayed at {url}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// On the sign-in page: signs in as `user`; returns the consent page's Allow button.
pub(crate) async fn sign_in(browser: &Client, user: &str, password: &str) -> Element {
    let username = browser
        .wait()
        .for_element(Locator::Id("username"))
        .await
        .unwrap();
    username.send_keys(user).await.unwrap();
    let field = browser.find(Locator::Id("password")).await.unwrap();
    field.send_keys(password).await.unwrap();
    browser
        .find(Locator::Id("sign-in"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait()
        .for_element(Locator::Id("approve"))
        .await
        .unwrap()
}

/// On the sign-in page: signs in as `user`, then allows access on the consent page.
pub(crate) async fn sign_in_and_allow(browser: &Client, user: &str, password: &str) {
    sign_in(browser, user, password)
        .await
        .click()
        .await
        .unwrap();
}

/// A client's callback listening on loopback, so the browser lands on a page; its URL.
pub(crate) fn callback() -> String {
    let listener = super::tokio_listener();
    let url = format!(
        "http://127.0.0.1:{}/callback",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(async move {
        let app = axum::Router::new().route(
            "/callback",
            axum::routing::get(|| async { "You may close this window." }),
        );
        axum::serve(listener, app).await.unwrap();
    });
    url
}
