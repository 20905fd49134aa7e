//! The doors' key check (chat completions, `/mcp`, gRPC): with an API key configured, a request
//! that does not carry it is refused before any handler runs (why, and how the key reaches the
//! app: `api::api_key`). The admin port has no key: it serves probes and scrapers, no tools.
//!
//! - A refusal is each door's own: gRPC clients get `UNAUTHENTICATED` (a trailers-only answer:
//!   an HTTP 401 would surface as a transport error), the others 401 with
//!   `WWW-Authenticate: Bearer` and the chat door's JSON error shape.
//! - An admitted request loses its `Authorization` header: it held the pod's key, which must not
//!   travel on (the chat door would otherwise pass a caller's `Authorization` to the upstream).

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::api_key::{ApiKey, Unauthenticated};

/// The `code` of the JSON refusal: OpenAI's own for a bad key, which its clients know.
const CODE: &str = "invalid_api_key";

/// `router` behind the key check; without a key, `router` as it is (no layer on the call path).
pub(crate) fn guarded(router: Router, key: Option<ApiKey>) -> Router {
    match key {
        Some(key) => router.layer(axum::middleware::from_fn_with_state(key, require_key)),
        None => router,
    }
}

/// Admits requests carrying `key`.
async fn require_key(State(key): State<ApiKey>, mut request: Request, next: Next) -> Response {
    match key.admits(request.headers().get(header::AUTHORIZATION).map(HeaderValue::as_bytes)) {
        Ok(()) => {
            request.headers_mut().remove(header::AUTHORIZATION);
            next.run(request).await
        }
        Err(reason) => {
            tracing::info!(%reason, path = %request.uri().path(), "request refused: no valid API key");
            refusal(&request, reason)
        }
    }
}

/// The answer to a request without the key, in its door's form.
fn refusal(request: &Request, reason: Unauthenticated) -> Response {
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if grpc {
        return tonic::Status::unauthenticated(reason.to_string()).into_http();
    }
    let challenge = match reason {
        Unauthenticated::Missing => r#"Bearer realm="spearlet""#,
        Unauthenticated::NotBearer | Unauthenticated::WrongKey => r#"Bearer realm="spearlet", error="invalid_token""#,
    };
    let body = serde_json::json!({
        "error": { "message": reason.to_string(), "type": "authentication_error", "code": CODE, "param": null }
    });
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, challenge)], axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::post;
    use tower::ServiceExt as _;

    const KEY: &str = "the-pods-key-0123456789";

    /// A door that echoes the `Authorization` header it was handed.
    fn door(key: Option<&str>) -> Router {
        let key = key.map(|k| ApiKey::parse(k).expect("a valid key"));
        let door = Router::new().route(
            "/door",
            post(|headers: axum::http::HeaderMap| async move {
                format!("authorization={:?}", headers.get(header::AUTHORIZATION))
            }),
        );
        guarded(door, key)
    }

    async fn send(router: Router, content_type: &str, authorization: Option<&str>) -> Response {
        let mut request = Request::post("/door").header(header::CONTENT_TYPE, content_type);
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        router.oneshot(request.body(Body::empty()).expect("a request")).await.expect("infallible")
    }

    async fn body(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.expect("a body");
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[tokio::test]
    async fn the_key_is_admitted_and_goes_no_further() {
        let response = send(door(Some(KEY)), "application/json", Some(&format!("Bearer {KEY}"))).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body(response).await, "authorization=None");
    }

    #[tokio::test]
    async fn without_the_key_json_callers_get_401_with_a_challenge() {
        for authorization in [None, Some("Bearer not-the-key-of-this-pod"), Some("Basic dXNlcjpwYXNz")] {
            let response = send(door(Some(KEY)), "application/json", authorization).await;
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{authorization:?}");
            let challenge = response.headers().get(header::WWW_AUTHENTICATE).expect("a challenge");
            assert!(challenge.to_str().expect("ascii").starts_with("Bearer realm=\"spearlet\""));
            let text = body(response).await;
            assert!(text.contains(CODE) && text.contains("SPEAR_API_KEY"), "{text}");
            assert!(!text.contains(KEY), "{text}");
        }
    }

    #[tokio::test]
    async fn without_the_key_grpc_callers_get_unauthenticated() {
        let response = send(door(Some(KEY)), "application/grpc+proto", Some("Bearer wrong-key-wrong-key")).await;
        assert_eq!(response.status(), StatusCode::OK, "gRPC refusals are trailers-only answers");
        let status = tonic::Status::from_header_map(response.headers()).expect("a grpc-status header");
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("SPEAR_API_KEY"), "{}", status.message());
    }

    #[tokio::test]
    async fn without_a_configured_key_requests_pass_as_they_are() {
        let response = send(door(None), "application/json", Some("Bearer the-callers-own-upstream-key")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(body(response).await.contains("the-callers-own-upstream-key"));
    }
}
