//! The sign-in and consent pages in a real browser: headless Chromium driven through
//! WebDriver (Debian's `chromium` and `chromium-driver`). A Client ID Metadata Document client
//! asks for access; the person signs in, reads the consent page (whose screenshot is read
//! back by OCR, Debian's `tesseract-ocr`, for the client's host and the localhost warning),
//! allows, and the browser lands on the client's callback with a code that buys a token that
//! calls a tool. The consent is then revoked from the account page, in the same browser.

use crate::common;

use common::authz::{PASSWORD, own_server, pkce, query};
use common::chromium::{browser, callback, ocr, sign_in, wait_for_url};
use common::documents::{Answer, document_server};
use fantoccini::Locator;
use serde_json::json;
use url::Url;

#[tokio::test]
async fn a_person_signs_in_reads_the_consent_page_and_allows_access() {
    let (docs, ca) = document_server().await;
    let server = own_server(
        "consent-browser",
        "default",
        &[
            "--authz-allow-loopback-documents",
            "--authz-document-root-cert",
            ca.to_str().unwrap(),
        ],
    );
    let base = format!("http://127.0.0.1:{}", server.port);
    let callback = callback();
    let path = "browser-client.json";
    docs.set(
        path,
        Answer::Json {
            body: docs.document(
                path,
                json!({"client_name": "Harbor Desktop", "redirect_uris": [callback]}),
            ),
            cache: "max-age=60",
        },
    );
    let client_id = docs.url(path);
    let (verifier, challenge) = pkce();
    let authorize = Url::parse_with_params(
        &format!("{base}/authorize"),
        &[
            ("response_type", "code"),
            ("client_id", client_id.as_str()),
            ("redirect_uri", callback.as_str()),
            ("code_challenge", challenge.as_str()),
            ("code_challenge_method", "S256"),
            ("state", "browser-state"),
        ],
    )
    .unwrap();

    let (_driver, browser) = browser().await;
    browser.goto(authorize.as_str()).await.unwrap();
    let approve = sign_in(&browser, "alice", PASSWORD).await;

    // What the person sees: the client's name, the host of its client_id, the redirect's
    // host, and the warning that the code goes to this machine.
    let host = browser.find(Locator::Id("client-host")).await.unwrap();
    assert_eq!(host.text().await.unwrap(), "localhost");
    let warning = browser
        .find(Locator::Id("localhost-warning"))
        .await
        .unwrap();
    assert!(warning.is_displayed().await.unwrap());
    let seen = ocr(&browser.screenshot().await.unwrap(), "consent");
    for expected in ["Harbor Desktop", "localhost", "127.0.0.1", "this computer"] {
        assert!(
            seen.contains(expected),
            "the screenshot should show {expected:?}; OCR read:\n{seen}"
        );
    }

    approve.click().await.unwrap();
    let landed = wait_for_url(&browser, &callback).await;
    let answer = query(&landed);
    assert_eq!(answer["state"], "browser-state");
    assert_eq!(answer["iss"], base);
    let response = reqwest::Client::new()
        .post(format!("{base}/token"))
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", answer["code"].as_str()),
            ("client_id", client_id.as_str()),
            ("code_verifier", verifier.as_str()),
        ])
        .send()
        .await
        .unwrap();
    let tokens: serde_json::Value = response.json().await.unwrap();
    let reply = server
        .client()
        .with_bearer(tokens["access_token"].as_str().unwrap())
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert_eq!((reply.status, reply.error_code()), (200, None));

    // The consent is listed on the account page, and revoked there.
    browser.goto(&format!("{base}/account")).await.unwrap();
    let table = browser.find(Locator::Id("consents")).await.unwrap();
    assert!(table.text().await.unwrap().contains("Harbor Desktop"));
    browser
        .find(Locator::Css("#consents button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The click reloads the page: until the new one is in, the table found may be the old
    // page's (stale once the new one replaces it), so read it again until it says so.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = match browser.find(Locator::Id("consents")).await {
            Ok(table) => table.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if text.contains("No application is remembered") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never revoked: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Revoking the consent cut the application off: its access token stops working.
    let access = tokens["access_token"].as_str().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let reply = server
            .client()
            .with_bearer(access)
            .request("tools/list", json!({}))
            .await
            .unwrap();
        if reply.status == 401 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the revoked client's token still works"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    browser.close().await.unwrap();
}
