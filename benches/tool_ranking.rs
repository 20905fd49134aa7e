//! The tool ranker (`spear::policy::rank`) on real data: retrieval quality and cost.
//!
//! - **Quality.** The catalog and queries in `benches/data/tool_retrieval/` (1,507 real tools and
//!   933 real user queries with their gold tools, derived from the Berkeley Function Calling
//!   Leaderboard's live categories, Apache-2.0; source, derivation and caveats in its README).
//!   Each query is ranked against the whole catalog; recall@5/10/20 and MRR per split, strict
//!   (the gold tool itself) and lenient (any catalog tool with the gold tool's name and
//!   parameters: the catalog holds rewordings of the same tool), next to a random ranker as the
//!   floor. The ranker's weights were chosen on the `tune` split only; `heldout` is reported,
//!   never tuned on.
//! - **Prompt tokens** of the tool definitions per round, `all` against `relevance`, on a 500-tool
//!   catalog (the example registry's figure comes from `spearlet explain --connect`).
//! - **Cost** (criterion): building the index over 1,000 tools (once per catalog change) and
//!   ranking 1,000 tools for one request (issue target ≤ 100 µs), against the baseline of
//!   scanning the same tools' descriptions for the query's first word.
//!
//! Run: `cargo bench --bench tool_ranking`; `TOOL_RANKING_SWEEP=1` runs the tuning grid instead
//! (on the `tune` split only) and prints the best parameters. Under `cargo test --all-targets` the quality part
//! runs in full (it is quick) and criterion runs each measurement once.
#![allow(clippy::too_many_lines, reason = "a test or a bench is one scenario, read top to bottom")]
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

use std::collections::HashSet;
use std::hint::black_box;

use criterion::Criterion;
use serde_json::Value;
use spear::policy::rank::{RankParams, Role, ToolIndex, ToolText, Turn};
use spear::policy::select;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/data/tool_retrieval");
const KS: [usize; 3] = [5, 10, 20];

struct CatalogTool {
    id: String,
    name: String,
    description: String,
    parameters: Value,
}

struct Query {
    text: String,
    gold: Vec<String>,
    /// Per gold tool, the catalog tools that are the same tool reworded (itself included).
    gold_equiv: Vec<Vec<String>>,
    split: String,
}

fn read_jsonl(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(format!("{DATA}/{name}")).unwrap_or_else(|e| panic!("read {name}: {e}"));
    text.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{name}: {e}"))).collect()
}

fn string(value: &Value, key: &str) -> String {
    value.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

fn load() -> (Vec<CatalogTool>, Vec<Query>) {
    let catalog = read_jsonl("catalog.jsonl")
        .into_iter()
        .map(|t| CatalogTool {
            id: format!("{}/{}", string(&t, "server"), string(&t, "name")),
            name: string(&t, "name"),
            description: string(&t, "description"),
            parameters: t.get("parameters").cloned().unwrap_or(Value::Null),
        })
        .collect();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect()).unwrap_or_default()
    };
    let queries = read_jsonl("queries.jsonl")
        .into_iter()
        .map(|q| Query {
            text: string(&q, "query"),
            gold: strings(&q["gold"]),
            gold_equiv: q["gold_equiv"].as_array().map(|a| a.iter().map(strings).collect()).unwrap_or_default(),
            split: string(&q, "split"),
        })
        .collect();
    (catalog, queries)
}

/// The index over `tools`: the tool's own name (the catalog's group names carry no meaning, so
/// the server field is empty), description and parameters.
fn index(tools: &[CatalogTool], params: RankParams) -> ToolIndex {
    ToolIndex::build_with(
        params,
        tools.iter().map(|t| ToolText {
            name: &t.name,
            server: "",
            description: &t.description,
            input_schema: Some(&t.parameters),
        }),
    )
}

#[derive(Default)]
struct Totals {
    queries: usize,
    recall: [f64; 3],
    mrr: f64,
}

impl Totals {
    /// Adds one query's ranking (catalog ids, best first) against its gold groups: a group is
    /// found at the first rank where any of its members appears.
    fn add(&mut self, ranking: &[&str], groups: &[HashSet<&str>]) {
        if groups.is_empty() {
            return;
        }
        self.queries += 1;
        let found_at: Vec<Option<usize>> =
            groups.iter().map(|group| ranking.iter().position(|id| group.contains(id))).collect();
        for (slot, k) in KS.iter().enumerate() {
            let found = found_at.iter().filter(|at| at.is_some_and(|at| at < *k)).count();
            self.recall[slot] += found as f64 / groups.len() as f64;
        }
        if let Some(first) = found_at.iter().flatten().min() {
            self.mrr += 1.0 / (*first as f64 + 1.0);
        }
    }

    fn row(&self, label: &str) -> String {
        let n = self.queries.max(1) as f64;
        format!(
            "{label:<34} {:>6} {:>8.3} {:>8.3} {:>8.3} {:>7.3}",
            self.queries,
            self.recall[0] / n,
            self.recall[1] / n,
            self.recall[2] / n,
            self.mrr / n
        )
    }
}

/// A deterministic shuffle (xorshift), for the random floor.
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut ids: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ids.swap(i, (state % (i as u64 + 1)) as usize);
    }
    ids
}

/// The ranker's strict and lenient totals on one split, and the random floor's.
fn evaluate(index: &ToolIndex, catalog: &[CatalogTool], queries: &[Query], split: &str) -> [Totals; 3] {
    let mut strict = Totals::default();
    let mut lenient = Totals::default();
    let mut random = Totals::default();
    for (q, query) in queries.iter().enumerate().filter(|(_, q)| q.split == split) {
        let turns = [Turn { role: Role::User, text: &query.text }];
        let ranked = index.top(&index.query(&turns), 20, |_| true);
        let ranking: Vec<&str> = ranked.iter().map(|(id, _)| catalog[*id as usize].id.as_str()).collect();
        let strict_groups: Vec<HashSet<&str>> = query.gold.iter().map(|g| HashSet::from([g.as_str()])).collect();
        let lenient_groups: Vec<HashSet<&str>> =
            query.gold_equiv.iter().map(|group| group.iter().map(String::as_str).collect()).collect();
        strict.add(&ranking, &strict_groups);
        lenient.add(&ranking, &lenient_groups);
        let random_ranking: Vec<&str> =
            shuffled(catalog.len(), q as u64 + 1).into_iter().take(20).map(|i| catalog[i].id.as_str()).collect();
        random.add(&random_ranking, &strict_groups);
    }
    [strict, lenient, random]
}

fn quality(catalog: &[CatalogTool], queries: &[Query]) {
    let index = index(catalog, RankParams::default());
    println!(
        "tool ranking: {} tools, {} queries (tune {}, heldout {}), {:?}",
        catalog.len(),
        queries.len(),
        queries.iter().filter(|q| q.split == "tune").count(),
        queries.iter().filter(|q| q.split == "heldout").count(),
        RankParams::default()
    );
    println!("{:<34} {:>6} {:>8} {:>8} {:>8} {:>7}", "ranker / split / gold", "n", "R@5", "R@10", "R@20", "MRR");
    for split in ["tune", "heldout"] {
        let [strict, lenient, random] = evaluate(&index, catalog, queries, split);
        println!("{}", strict.row(&format!("bm25f / {split} / strict")));
        println!("{}", lenient.row(&format!("bm25f / {split} / same tool reworded")));
        println!("{}", random.row(&format!("random / {split} / strict")));
    }
}

/// The grid the default [`RankParams`] were chosen from, scored on the `tune` split only:
/// strict recall@20 first, MRR to break near-ties. Prints the best few; never reads `heldout`.
fn sweep(catalog: &[CatalogTool], queries: &[Query]) {
    let mut results: Vec<(f64, RankParams, String)> = Vec::new();
    for name in [2.0, 3.0, 4.0, 6.0] {
        for description in [0.5, 1.0] {
            for parameters in [0.25, 0.5, 1.0] {
                for k1 in [0.9, 1.2, 1.6, 2.0] {
                    for b in [0.5, 0.75, 0.9] {
                        let params = RankParams { field_weights: [name, 1.0, description, parameters], k1, b };
                        let [strict, _, _] = evaluate(&index(catalog, params), catalog, queries, "tune");
                        let n = strict.queries.max(1) as f64;
                        let objective = strict.recall[2] / n + 0.25 * strict.mrr / n;
                        results.push((objective, params, strict.row("tune / strict")));
                    }
                }
            }
        }
    }
    results.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (objective, params, row) in results.iter().take(15) {
        println!("{objective:.4} {params:?}\n    {row}");
    }
}

/// Prompt tokens of tool definitions per round (`select::estimated_tokens`: JSON bytes / 4) on
/// a 500-tool catalog (the first 500 distinct names, as `tests/it/chat.rs` serves them), with
/// `all` against `relevance` at K = 10 and 20 (plus `find_tools`), averaged over every query.
fn tokens(catalog: &[CatalogTool], queries: &[Query]) {
    let mut seen = HashSet::new();
    let tools: Vec<&CatalogTool> = catalog.iter().filter(|t| seen.insert(t.name.as_str())).take(500).collect();
    let index = ToolIndex::build_with(
        RankParams::default(),
        tools.iter().map(|t| ToolText {
            name: &t.name,
            server: "",
            description: &t.description,
            input_schema: Some(&t.parameters),
        }),
    );
    let all = select::estimated_tokens(tools.iter().map(definition));
    let (find_description, find_schema) = select::find_tools_definition();
    let find_tools = (select::FIND_TOOLS, Some(find_description.as_str()), &find_schema);
    println!("prompt tokens of tool definitions per round, {} tools (estimate: JSON bytes / 4)", tools.len());
    println!("{:<34} {:>8} {:>10}", "selection", "tokens", "vs all");
    println!("{:<34} {all:>8} {:>10.3}", "all", 1.0);
    for k in [10, 20] {
        let mut total = 0usize;
        for query in queries {
            let turns = [Turn { role: Role::User, text: &query.text }];
            let top = index.top(&index.query(&turns), k, |_| true);
            let offered = top.iter().map(|(id, _)| definition(&tools[*id as usize]));
            total += select::estimated_tokens(offered.chain([find_tools]));
        }
        let mean = total / queries.len().max(1);
        println!("{:<34} {mean:>8} {:>10.3}", format!("relevance, K = {k}, + find_tools"), mean as f64 / all as f64);
    }
}

fn definition<'a>(t: &&'a CatalogTool) -> (&'a str, Option<&'a str>, &'a Value) {
    (t.name.as_str(), Some(t.description.as_str()), &t.parameters)
}

fn cost(catalog: &[CatalogTool], criterion: &mut Criterion) {
    let tools = &catalog[..catalog.len().min(1000)];
    let index = index(tools, RankParams::default());
    let turns = [
        Turn { role: Role::User, text: "Find me a vegetarian restaurant in San Francisco for tonight" },
        Turn { role: Role::Other, text: "Sure, which area of the city do you prefer?" },
        Turn { role: Role::User, text: "Somewhere near the Mission district, and book a table for two at 7pm please" },
    ];
    let first_word = "restaurant";
    criterion.bench_function("scan_descriptions_1000 (baseline)", |b| {
        b.iter(|| black_box(tools.iter().filter(|t| t.description.contains(black_box(first_word))).count()))
    });
    criterion.bench_function("rank_1000_tools_top20", |b| {
        b.iter(|| {
            let query = index.query(black_box(&turns));
            black_box(index.top(&query, 20, |_| true))
        })
    });
    criterion.bench_function("build_index_1000_tools", |b| {
        b.iter(|| black_box(self::index(black_box(tools), RankParams::default())))
    });
}

fn main() {
    let (catalog, queries) = load();
    if std::env::var_os("TOOL_RANKING_SWEEP").is_some() {
        sweep(&catalog, &queries);
        return;
    }
    quality(&catalog, &queries);
    tokens(&catalog, &queries);
    let mut criterion = Criterion::default().configure_from_args();
    cost(&catalog, &mut criterion);
    criterion.final_summary();
}
