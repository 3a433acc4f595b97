//! `wharf-bench-issuer --listen ADDR --audience URI`: serves RFC 8414 metadata and a JWKS with
//! one fresh ES256 key, prints one access token (subject `bench`, scope `bench`, one hour)
//! signed with it on stdout, then serves until killed.

use std::net::SocketAddr;

use axum::routing::get;
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::json;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut listen: SocketAddr = "127.0.0.1:18095".parse()?;
    let mut audience = String::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs an address")?.parse()?,
            "--audience" => audience = args.next().ok_or("--audience needs a URI")?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let issuer = format!("http://{listen}");
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
        .map_err(|_| "key generation failed")?;
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
        .map_err(|_| "key parsing failed")?;
    let point = pair.public_key().as_ref();
    let jwk = json!({ "kty": "EC", "crv": "P-256", "kid": "bench", "alg": "ES256", "use": "sig",
        "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..65]) });
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("bench".into());
    let token = encode(
        &header,
        &json!({ "iss": issuer, "sub": "bench", "aud": audience, "scope": "bench",
            "iat": now, "exp": now + 3600 }),
        &EncodingKey::from_ec_der(pkcs8.as_ref()),
    )?;
    let metadata = json!({ "issuer": issuer, "jwks_uri": format!("{issuer}/jwks") });
    let app = Router::new()
        .route(
            "/.well-known/oauth-authorization-server",
            get(move || {
                let m = metadata.clone();
                async move { Json(m) }
            }),
        )
        .route(
            "/jwks",
            get(move || {
                let keys = json!({ "keys": [jwk.clone()] });
                async move { Json(keys) }
            }),
        );
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("{token}");
    axum::serve(listener, app).await?;
    Ok(())
}
