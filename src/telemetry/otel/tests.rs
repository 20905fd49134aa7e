use super::*;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

#[test]
fn tracing_is_off_without_an_endpoint() {
    assert_eq!(protocol_from_env(env(&[])).expect("valid"), None);
    assert_eq!(protocol_from_env(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])).expect("valid"), None);
    assert_eq!(protocol_from_env(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "  ")])).expect("valid"), None);
}

#[test]
fn an_endpoint_turns_tracing_on_with_the_specs_default_protocol() {
    let on = protocol_from_env(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")])).expect("valid");
    assert_eq!(on, Some(Protocol::HttpProtobuf));
    let traces_only =
        env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
    assert_eq!(protocol_from_env(traces_only).expect("valid"), Some(Protocol::Grpc));
}

#[test]
fn the_traces_protocol_wins_over_the_general_one() {
    let vars = env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
    ]);
    assert_eq!(protocol_from_env(vars).expect("valid"), Some(Protocol::Grpc));
}

#[test]
fn disabled_sdk_or_exporter_none_turns_tracing_off() {
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
    assert_eq!(protocol_from_env(env(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")])).expect("valid"), None);
    assert_eq!(protocol_from_env(env(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")])).expect("valid"), None);
}

#[test]
fn unsupported_values_name_the_variable_and_the_fix() {
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
    let error = protocol_from_env(env(&[endpoint, ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")]))
        .expect_err("http/json is not built in");
    assert_eq!(
        error.to_string(),
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json' is not supported: use grpc or http/protobuf"
    );
    let error = protocol_from_env(env(&[endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")])).expect_err("no zipkin");
    assert!(error.to_string().starts_with("OTEL_TRACES_EXPORTER='zipkin'"), "{error}");
}

#[test]
fn meta_headers_carry_only_the_trace_context_entries() {
    let mut meta = rmcp::model::RequestMetaObject::new();
    meta.set_traceparent("00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01");
    meta.set_progress_token(rmcp::model::ProgressToken(rmcp::model::NumberOrString::Number(1)));
    let headers: Vec<_> = meta_headers(Some(&meta)).collect();
    assert_eq!(headers, [("traceparent", "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01")]);
    assert_eq!(meta_headers(None).count(), 0);
}

#[test]
fn agents_get_the_operators_export_settings_only_when_its_tracing_is_on() {
    let vars = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
    assert!(agent_env(vars(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), ("PATH", "/bin")])).is_empty());
    let passed = agent_env(vars(&[
        ("OTEL_SERVICE_NAME", "spear-operator"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
        ("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cret"),
        ("HOME", "/root"),
    ]));
    assert_eq!(
        passed,
        vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
        ])
    );
}
