//! The alerts and the dashboard the chart ships (`docs/operations.md`): the PrometheusRule
//! rendered by the real `helm` passes the real `promtool` (built from its Go module by
//! `hack/promtool.sh`): `check rules`, and `test rules` with `tests/alerts/*.test.yaml` on
//! synthetic series, where every alert is shown firing and silent; every alert carries a
//! severity, a summary, a description and a runbook link to a heading of `docs/operations.md`
//! that exists; both objects render only when enabled. That every metric they name is one the
//! binaries export is `cluster::metrics` (it scrapes a running agent and operator).
//!
//! promtool is `$SPEAR_PROMTOOL`, else the binary `hack/promtool.sh` builds into the cache; a
//! missing one panics with the command to run (as helm does in `chart.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use promql_parser::parser::{self, Expr};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::Value;

use crate::chart::{objects, render, repo};

/// The prometheus Go module version `hack/promtool.sh` builds; must match
/// `PROMETHEUS_MODULE_VERSION` there.
const PROMETHEUS_MODULE_VERSION: &str = "v0.315.1";
/// The Prometheus release that module version is; `promtool --version` names it.
const PROMETHEUS_VERSION: &str = "3.15.1";
/// Build revision of `hack/promtool.sh`; must match `BUILD_REVISION` there.
const PROMTOOL_BUILD_REVISION: &str = "b2";
/// Env var naming a promtool binary, overriding the cache path.
const ENV_PROMTOOL: &str = "SPEAR_PROMTOOL";

/// The dashboard the chart's ConfigMap carries.
const DASHBOARD: &str = "charts/spear-mcp/dashboards/spear-mcp.json";
/// The promtool unit tests of the rules.
const ALERT_TESTS: &str = "tests/alerts";
/// The page the chart's default `prometheusRule.runbookBaseURL` points at: one heading per alert.
const RUNBOOKS: &str = "docs/operations.md";

// === promtool ===

/// The promtool binary: `$SPEAR_PROMTOOL`, else where `hack/promtool.sh` puts the pinned version
/// (honouring its `SPEAR_CACHE_DIR`). Panics with the command to run when it is missing or
/// another version.
fn promtool() -> &'static Path {
    static PROMTOOL: OnceLock<PathBuf> = OnceLock::new();
    PROMTOOL.get_or_init(|| {
        let path = match std::env::var_os(ENV_PROMTOOL) {
            Some(path) => PathBuf::from(path),
            None => {
                let cache = match (std::env::var_os("SPEAR_CACHE_DIR"), std::env::var_os("HOME")) {
                    (Some(dir), _) => PathBuf::from(dir),
                    (None, Some(home)) => PathBuf::from(home).join(".cache/spear-mcp"),
                    (None, None) => {
                        panic!("promtool not found: run hack/promtool.sh and set {ENV_PROMTOOL} (HOME is not set)")
                    }
                };
                cache.join(format!("promtool/{PROMETHEUS_MODULE_VERSION}-{PROMTOOL_BUILD_REVISION}/bin/promtool"))
            }
        };
        if !path.is_file() {
            panic!(
                "promtool not found at {}: run hack/promtool.sh (builds promtool {PROMETHEUS_VERSION} from its Go module, about 9 minutes once), or set {ENV_PROMTOOL}",
                path.display()
            );
        }
        let (ok, version) = run_promtool_at(&path, &["--version"], &repo());
        assert!(ok, "{} --version failed:\n{version}", path.display());
        assert!(
            version.contains(&format!("version {PROMETHEUS_VERSION} ")),
            "{} is not promtool {PROMETHEUS_VERSION}: run hack/promtool.sh, or point {ENV_PROMTOOL} at its output:\n{version}",
            path.display()
        );
        path
    })
}

/// Runs promtool with `args` in `dir`: whether it succeeded, and stdout and stderr together.
fn run_promtool_at(promtool: &Path, args: &[&str], dir: &Path) -> (bool, String) {
    let output = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {} must work: {e}", promtool.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

// === what the chart ships ===

/// The chart's PrometheusRule, rendered with `prometheusRule.enabled=true` and `extra` values.
fn rendered_rule(extra: &[&str]) -> Value {
    let mut args = vec!["--set", "prometheusRule.enabled=true"];
    args.extend_from_slice(extra);
    let rules: Vec<Value> = objects(&render(&args)).into_iter().filter(|o| o["kind"] == "PrometheusRule").collect();
    assert_eq!(rules.len(), 1, "prometheusRule.enabled=true must render exactly one PrometheusRule");
    rules.into_iter().next().unwrap_or_default()
}

/// Every alerting rule of the rendered PrometheusRule (with default values).
fn alerts() -> Vec<Value> {
    static ALERTS: OnceLock<Vec<Value>> = OnceLock::new();
    ALERTS
        .get_or_init(|| {
            let rule = rendered_rule(&[]);
            let groups = rule["spec"]["groups"].as_array().cloned().unwrap_or_default();
            groups.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()).collect()
        })
        .clone()
}

/// Every alert's name and expression.
pub fn alert_expressions() -> Vec<(String, String)> {
    let alerts = alerts();
    assert!(!alerts.is_empty(), "the PrometheusRule must hold alerts");
    alerts
        .iter()
        .map(|a| {
            let name = a["alert"].as_str().expect("every rule of the PrometheusRule is an alert with a name");
            let expr = a["expr"].as_str().unwrap_or_else(|| panic!("alert {name} has an expression"));
            (name.to_string(), expr.to_string())
        })
        .collect()
}

/// The dashboard's JSON.
fn dashboard() -> Value {
    let text = std::fs::read_to_string(repo().join(DASHBOARD)).expect("the dashboard JSON must be readable");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} must be JSON: {e}"))
}

/// Grafana's interval variables, replaced by a duration PromQL accepts.
fn without_grafana_intervals(query: &str) -> String {
    ["$__rate_interval", "$__interval", "$__range"].iter().fold(query.to_string(), |q, v| q.replace(v, "5m"))
}

/// Every PromQL query of the dashboard, named by where it is: the panels' targets and the
/// selectors of the `label_values(selector, label)` variables.
pub fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard = dashboard();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        let title = panel["title"].as_str().unwrap_or_default();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_else(|| panic!("panel {title:?} has a target without expr"));
            queries.push((format!("panel {title:?}"), without_grafana_intervals(expr)));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        let Some(query) = variable["query"]["query"].as_str() else { continue };
        let name = variable["name"].as_str().unwrap_or_default();
        let selector = query
            .strip_prefix("label_values(")
            .and_then(|rest| rest.rsplit_once(','))
            .map(|(selector, _)| selector.trim())
            .unwrap_or_else(|| panic!("variable {name}: only label_values(selector, label) queries are used: {query}"));
        queries.push((format!("variable {name}"), without_grafana_intervals(selector)));
    }
    assert!(queries.len() > 10, "the dashboard must have its panels: {queries:?}");
    queries
}

/// The metric names `expr` selects (every vector selector's, ranges included). Panics naming
/// `what` when the expression does not parse.
pub fn metric_names(what: &str, expr: &str) -> BTreeSet<String> {
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = String;
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, String> {
            let selector = match expr {
                Expr::VectorSelector(selector) => selector,
                Expr::MatrixSelector(matrix) => &matrix.vs,
                _ => return Ok(true),
            };
            match &selector.name {
                Some(name) => {
                    self.0.insert(name.clone());
                    Ok(true)
                }
                None => Err(format!("a selector without a metric name ({selector})")),
            }
        }
    }
    let parsed =
        parser::parse(expr).unwrap_or_else(|e| panic!("{what}: the query does not parse as PromQL: {e}\n{expr}"));
    let mut names = Names(BTreeSet::new());
    walk_expr(&mut names, &parsed).unwrap_or_else(|e| panic!("{what}: {e}\n{expr}"));
    names.0
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

// === tests ===

#[test]
fn the_rules_pass_promtool_check_and_every_unit_test_on_synthetic_series() {
    let promtool = promtool();
    let dir = tempfile::tempdir().expect("tempdir");
    // The rule file promtool reads is the PrometheusRule's spec: `groups:` exactly.
    let spec = serde_yaml::to_string(&rendered_rule(&[])["spec"]).expect("the spec serializes");
    std::fs::write(dir.path().join("rules.yaml"), spec).expect("write rules.yaml");
    let (ok, output) = run_promtool_at(promtool, &["check", "rules", "rules.yaml"], dir.path());
    assert!(ok, "promtool check rules failed:\n{output}");
    let count = alert_expressions().len();
    assert!(output.contains(&format!("SUCCESS: {count} rules found")), "{output}");

    let mut tests = Vec::new();
    for entry in std::fs::read_dir(repo().join(ALERT_TESTS)).expect("tests/alerts must exist") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if name.ends_with(".test.yaml") {
            std::fs::copy(&path, dir.path().join(&name)).expect("copy the test file");
            tests.push(name);
        }
    }
    tests.sort();
    assert!(tests.len() >= 2, "the agent and operator alert tests: {tests:?}");
    let mut args = vec!["test", "rules"];
    args.extend(tests.iter().map(String::as_str));
    let (ok, output) = run_promtool_at(promtool, &args, dir.path());
    assert!(ok, "promtool test rules failed:\n{output}");
    assert_eq!(output.matches("SUCCESS").count(), tests.len(), "{output}");
}

#[test]
fn every_alert_is_tested_firing_and_silent() {
    let mut firing = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for entry in std::fs::read_dir(repo().join(ALERT_TESTS)).expect("tests/alerts must exist") {
        let path = entry.expect("a directory entry").path();
        let text = std::fs::read_to_string(&path).expect("readable");
        let tests: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for test in tests["tests"].as_array().into_iter().flatten() {
            for case in test["alert_rule_test"].as_array().into_iter().flatten() {
                let name = case["alertname"].as_str().unwrap_or_default().to_string();
                match case["exp_alerts"].as_array() {
                    Some(expected) if !expected.is_empty() => firing.insert(name),
                    _ => silent.insert(name),
                };
            }
        }
    }
    for (name, _) in alert_expressions() {
        assert!(firing.contains(&name), "{name} has no promtool test where it fires (tests/alerts)");
        assert!(silent.contains(&name), "{name} has no promtool test where it stays silent (tests/alerts)");
    }
}

#[test]
fn every_alert_has_a_severity_an_explanation_and_a_runbook_section_in_the_operations_doc() {
    let runbooks = std::fs::read_to_string(repo().join(RUNBOOKS)).expect(RUNBOOKS);
    let anchors: BTreeSet<String> =
        runbooks.lines().filter_map(|l| l.strip_prefix('#')).map(|h| anchor(h.trim_start_matches('#'))).collect();
    for alert in alerts() {
        let name = alert["alert"].as_str().unwrap_or_default();
        let severity = alert["labels"]["severity"].as_str().unwrap_or_default();
        assert!(["critical", "warning"].contains(&severity), "{name}: severity {severity:?}");
        for key in ["summary", "description"] {
            let text = alert["annotations"][key].as_str().unwrap_or_default();
            assert!(text.len() > 20, "{name}: annotation {key} must say what is wrong: {text:?}");
        }
        let runbook = alert["annotations"]["runbook_url"].as_str().unwrap_or_default();
        let (_, fragment) =
            runbook.split_once('#').unwrap_or_else(|| panic!("{name}: runbook_url without #: {runbook}"));
        assert_eq!(fragment, name.to_lowercase(), "{name}: the runbook anchor is the alert's name");
        assert!(anchors.contains(fragment), "{name}: {RUNBOOKS} has no heading with anchor #{fragment}");
        assert!(
            runbook.starts_with(&format!("https://github.com/spear-dev/spear-mcp/blob/main/{RUNBOOKS}#")),
            "{name}: the default runbookBaseURL points at {RUNBOOKS}: {runbook}"
        );
    }
}

#[test]
fn the_rule_and_the_dashboard_render_only_when_enabled_with_their_labels() {
    let kinds = |yaml: &str| objects(yaml).into_iter().map(|o| o["kind"].as_str().unwrap_or_default().to_string());
    let defaults: Vec<String> = kinds(&render(&[])).collect();
    assert!(!defaults.iter().any(|k| k == "PrometheusRule"), "off by default: {defaults:?}");
    let dashboards = |yaml: &str| {
        objects(yaml).into_iter().filter(|o| o["metadata"]["name"] == "spear-mcp-dashboard").collect::<Vec<_>>()
    };
    assert!(dashboards(&render(&[])).is_empty(), "the dashboard ConfigMap is off by default");

    // The rule: the ruleSelector's labels on the object, ruleLabels on every alert.
    let rule =
        rendered_rule(&["--set", "prometheusRule.labels.release=kps", "--set", "prometheusRule.ruleLabels.team=mcp"]);
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    assert_eq!(rule["metadata"]["namespace"], crate::chart::NAMESPACE);
    for group in rule["spec"]["groups"].as_array().into_iter().flatten() {
        for alert in group["rules"].as_array().into_iter().flatten() {
            assert_eq!(alert["labels"]["team"], "mcp", "{alert}");
            assert!(alert["labels"]["severity"].is_string(), "ruleLabels add to severity: {alert}");
        }
    }
    let rebased = rendered_rule(&["--set", "prometheusRule.runbookBaseURL=https://wiki.example/spear"]);
    let url = &rebased["spec"]["groups"][0]["rules"][0]["annotations"]["runbook_url"];
    assert_eq!(url, "https://wiki.example/spear#mcpserverdown");

    // The dashboard: the sidecar's label, the namespace asked for, the JSON file unchanged.
    let rendered = render(&[
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "grafanaDashboard.namespace=monitoring",
        "--set",
        "grafanaDashboard.annotations.grafana_folder=MCP",
    ]);
    let configmaps = dashboards(&rendered);
    assert_eq!(configmaps.len(), 1, "one dashboard ConfigMap when enabled");
    let configmap = &configmaps[0];
    assert_eq!(configmap["kind"], "ConfigMap");
    assert_eq!(configmap["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(configmap["metadata"]["namespace"], "monitoring");
    assert_eq!(configmap["metadata"]["annotations"]["grafana_folder"], "MCP");
    let carried: Value = serde_json::from_str(configmap["data"]["spear-mcp.json"].as_str().unwrap_or_default())
        .expect("JSON in the ConfigMap");
    assert_eq!(carried, dashboard(), "the ConfigMap carries charts/spear-mcp/dashboards/spear-mcp.json as it is");
}

#[test]
fn every_alert_and_dashboard_query_parses_and_names_spear_metrics() {
    let mut names = BTreeMap::new();
    for (what, expr) in
        alert_expressions().into_iter().map(|(n, e)| (format!("alert {n}"), e)).chain(dashboard_queries())
    {
        let selected = metric_names(&what, &expr);
        assert!(!selected.is_empty(), "{what} selects no metric: {expr}");
        for name in selected {
            assert!(
                name.starts_with("mcp_") || name.starts_with("spear_operator_") || name.starts_with("spear_log_"),
                "{what} selects {name}, which neither binary exports (mcp_* is the agent's, spear_operator_* the operator's, spear_log_* both's)"
            );
            names.entry(name).or_insert(what.clone());
        }
    }
    // Each alert and each panel is about one of the binaries, so both sets must appear.
    assert!(names.keys().any(|n| n.starts_with("mcp_")) && names.keys().any(|n| n.starts_with("spear_operator_")));
}

#[test]
fn metric_names_are_read_from_the_promql_syntax_tree() {
    let expr = r#"sum by (server_id) (rate(mcp_tool_call_error_total{code!="x"}[5m])) / on() group_left max(mcp_server_state{state="down"}) or vector(0)"#;
    let names: Vec<String> = metric_names("example", expr).into_iter().collect();
    assert_eq!(names, ["mcp_server_state", "mcp_tool_call_error_total"], "label names and functions are not metrics");
    assert_eq!(anchor(" McpServerDown"), "mcpserverdown");
    assert_eq!(anchor("Alerts and dashboards"), "alerts-and-dashboards");
}
