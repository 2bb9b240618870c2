"""docs/model-quality.md from the demo's `quality.json` (what the `report` command renders).

`quality.json` (written by `demo` next to the demo repository) holds everything the page shows: the data, the
training configuration, epochs and measured wall time of both models, and `check`'s comparison of precisions.
`report` only formats it, so the page can be regenerated without training, and a test holds the committed page
equal to `render(quality.json)`.
"""

from __future__ import annotations

from typing import Any

# The LightGCN paper's Gowalla figures (He et al., SIGIR 2020, Table 3, 3 layers), shown for context only.
PAPER_RECALL, PAPER_NDCG = 0.1830, 0.1550
INT8_AUC_BUDGET_PP = 0.1


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def _evaluations(history: list[dict[str, Any]]) -> str:
    n = sum("recall@20" in h for h in history)
    return "1 test evaluation" if n == 1 else f"{n} test evaluations"


def _epochs(n: int) -> str:
    return f"{n} epoch" if n == 1 else f"{n} epochs"


def _pipeline_section(q: dict[str, Any], add: Any) -> None:
    r = q["ranker"]
    t, c, p = r["training"], r["training"]["config"], r["pipeline"]
    early, w, data = r["early_lightgcn"], t["window"], t["data"]
    add(f"## Recall → rank: the `{p['name']}` pipeline (`POST /v1/recommend/{p['name']}`)")
    add("")
    add(
        f"**Label window**: each user's Gowalla training interactions are split at random (seed {w['seed']}) into "
        f"an early and a late window: a user with at least {w['min_items']} items sends "
        f"`max(1, round({w['late_share']} · n))` of them to the late window, the others keep all their items early "
        f"({early['data']['train_interactions']:,} early and {early['data']['test_interactions']:,} late "
        "interactions). LightGCN-A is trained on the early window with the LightGCN recipe above "
        f"({_epochs(early['epochs'])}, {_duration(early['train_seconds'])}); on the late window it reaches "
        f"Recall@20 {early['test']['recall']:.4f} and NDCG@20 {early['test']['ndcg']:.4f}."
    )
    add("")
    add(
        f"**Training rows**: for each of the {data['users']:,} users with late items, LightGCN-A's top "
        f"{c['candidates']} items (early items excluded); a candidate is a positive when it is one of the user's late "
        f"items, every other candidate a (hard) negative: {data['rows']:,} rows, {data['positives']:,} positives "
        f"({data['late_items_recalled']:.1%} of the late items are among the candidates). The features come from the "
        "early window only: the candidate features the pipeline computes (`recall_score`: LightGCN-A's score; "
        "`recall_rank`: the 0-based position in its list; `cooccurrence`: the sum over the user's early items `h` "
        f"of `w(h→c)` in a cosine ItemKNN table of the early interactions, `{c['neighbours']}` neighbours per item, "
        f"{data['cooccurrence_entries']:,} entries), the user's `activity` (history length in buckets "
        "`min(floor(log2(1 + n)), 15)`) and the item's `popularity` (training interactions, same buckets). "
        f"The users are split {1 - c['validation_share']:.0%} / {c['validation_share']:.0%} into training "
        f"({data['train_users']:,}) and validation ({data['validation_users']:,}) users."
    )
    add("")
    id_fields = "`activity` (user), `popularity` (item" + (") and `item` (the item id)" if c["item_ids"] else ")")
    add(
        f"**Ranking model** `{p['ranking_model']}` (module `gowalla_rank`): a DeepFM with fields {id_fields}, "
        f"k = {c['factors']}, MLP {'-'.join(map(str, c['hidden']))}, and the three candidate features as its dense "
        "input, read through transforms inside the graph (the server feeds raw values): standardised on the "
        "training rows for training, and refitted for serving on the served LightGCN's candidates of the training "
        "users with features from all training interactions (no labels): the serving-time histories are longer and "
        "the co-occurrence table denser than the early window's, which shifts the sums up."
    )
    add("")
    add("| candidate feature | transform | centre, training | scale, training | centre, served | scale, served |")
    add("| --- | --- | ---: | ---: | ---: | ---: |")
    names = ("recall_score", "recall_rank", "cooccurrence")
    for name, tr, sv in zip(names, t["dense_transforms"], r["served_transforms"], strict=True):
        what = "`log(1 + max(x, 0))`" if tr["kind"] == "log1p" else "`x`"
        add(
            f"| `{name}` | ({what} − centre) / scale | {tr['centre']:.4f} | {tr['scale']:.4f} | "
            f"{sv['centre']:.4f} | {sv['scale']:.4f} |"
        )
    add("")
    add(
        f"Binary cross-entropy, Adam with learning rate {c['lr']}, batches of {c['batch']:,}, L2 {c['l2']} on the "
        f"table rows; after each epoch the validation users' candidates are reranked (labels: their late items), "
        f"and the epoch with the best validation Recall@20 is exported; training stops {c['patience']} epochs "
        f"after it (at most {c['max_epochs']}). Best epoch: **{t['best_epoch']}** "
        f"({_duration(t['train_seconds'])} of training in all). Served with int8 tables and an fp32 dense graph."
    )
    add("")
    add(
        "| epoch | training log loss | validation log loss | validation AUC | validation Recall@20 | "
        "validation NDCG@20 |"
    )
    add("| ---: | ---: | ---: | ---: | ---: | ---: |")
    base = t["validation_baseline"]
    add(f"| LightGCN-A alone | | | | {base['recall@20']:.4f} | {base['ndcg@20']:.4f} |")
    for h in t["history"]:
        best = "**" if h["epoch"] == t["best_epoch"] else ""
        add(
            f"| {best}{h['epoch']}{best} | {h['train_log_loss']:.4f} | {h['validation_log_loss']:.4f} | "
            f"{h['validation_auc']:.4f} | {h['validation_recall@20']:.4f} | {h['validation_ndcg@20']:.4f} |"
        )
    add("")
    add(
        f'**Pipeline**: `recall_model = "{p["recall_model"]}"` (the LightGCN above, trained on all training '
        f'interactions), `ranking_model = "{p["ranking_model"]}"`, `candidates = {p["candidates"]}`, '
        f"`k = {p['k']}` (`models/demo/recserve.toml`, which `scripts/run-demo.sh` serves). At serving time the "
        "features come from all training interactions (the co-occurrence table exported with the ranker, the same "
        "weighting; popularity), as yesterday's window trains the ranker of today's recall stage. **Quality** on "
        "the Gowalla test split: for every test user, the served LightGCN's top N items with the user's training "
        "items excluded (a recommend request with those items in `exclude`), the candidate features as the server "
        "computes them (the served int8 tables' scores, the positions, the co-occurrence sum over the user's "
        "training items, which a request by `user_id` sends as its `history` too), ranked by the served ranker "
        "through its own graph, best 20; beside LightGCN alone (the first 20 of the same list). By `history`, the "
        "user is embedded from its training items."
    )
    add("")
    add("| users from | what | Recall@20 | NDCG@20 | test users |")
    add("| --- | --- | ---: | ---: | ---: |")
    for row in r["quality"]:
        add(
            f"| {row['users_from']} | {row['pipeline']} | {row['recall@20']:.4f} | {row['ndcg@20']:.4f} | "
            f"{row['test_users']:,} |"
        )
    add("")
    changes = []
    for users_from in dict.fromkeys(row["users_from"] for row in r["quality"]):
        rows = [row for row in r["quality"] if row["users_from"] == users_from]
        alone = next(row for row in rows if row["candidates"] is None)
        for row in rows:
            if row["candidates"] is not None:
                changes.append(
                    f"by {users_from}, N = {row['candidates']}: Recall@20 "
                    f"{row['recall@20'] - alone['recall@20']:+.4f} ({row['recall@20'] / alone['recall@20'] - 1:+.1%}), "
                    f"NDCG@20 {row['ndcg@20'] - alone['ndcg@20']:+.4f} ({row['ndcg@20'] / alone['ndcg@20'] - 1:+.1%})"
                )
    add(f"Against LightGCN alone, the pipeline changes the figures by: {'; '.join(changes)}.")
    add("")
    n = r["auc"][0]["candidates"]
    add(
        f"**AUC within the recall candidates**: the served LightGCN's top {n} per test user, the user's test items "
        "against the other candidates; pooled over all candidates of all users, and the mean over users (with both "
        "kinds) of each user's own AUC."
    )
    add("")
    add("| users from | scored by | AUC, pooled | AUC, mean per user | positives | candidates |")
    add("| --- | --- | ---: | ---: | ---: | ---: |")
    for row in r["auc"]:
        add(
            f"| {row['users_from']} | {row['scorer']} | {row['auc']:.4f} | {row['user_auc']:.4f} | "
            f"{row['positives']:,} | {row['rows']:,} |"
        )
    add("")
    add(
        "**Served = offline**: `scripts/recall-check.py --pipeline demo --send-history --user-field activity=activity "
        "--history` asks a running server for the same top 20 of every test user through `POST /v1/recommend/demo` "
        "and exits non-zero unless its Recall@20 and NDCG@20 equal the rows above to 4 decimals "
        "([models/README.md](../models/README.md#the-demo)). **Cost**: `scripts/bench-recommend.sh` times the "
        "recommend call with these features against the demo before them, stage by stage "
        "([benchmarks.md](benchmarks.md#the-recommend-pipeline-with-candidate-features))."
    )
    add("")


def render(q: dict[str, Any]) -> str:
    """The markdown page."""
    lines: list[str] = []
    add = lines.append
    add("# Model quality")
    add("")
    add("<!-- Generated by `python -m recserve_models report`; do not edit by hand. -->")
    add("")
    add(
        "Quality of the demo models in [`models/demo`](../models/demo), measured by the toolchain on held-out data, "
        "for every precision the server serves. Everything below was produced by one command:"
    )
    add("")
    add("```sh")
    add(q["command"])
    add("```")
    add("")
    add(
        "which generates the data, trains both models, exports and quantizes them, runs `check` on held-out data, "
        "writes the demo repository with its `quality.json`, and renders this page from it (`python -m "
        "recserve_models report --quality models/demo/quality.json --out docs/model-quality.md` renders it again "
        "without training)."
    )
    add(f"Training ran under `nice -n 10` on {q['machine']}, shared with other work: wall times are indicative only.")
    add("")

    d = q["deepfm"]
    train, data, config = d["training"], d["training"]["data"], d["training"]["config"]
    gen = q["criteo"]["train"]["generator"]
    add("## DeepFM (ranking)")
    add("")
    add(
        f"**Data**: synthetic Criteo-format rows from `generate-criteo` (seed {gen['seed']}, Zipf exponent "
        f"{gen['zipf']}, Kaggle vocabulary sizes capped at {gen['max_vocab']:,}, labels from a hidden teacher "
        f"model; see [models/README.md](../models/README.md#synthetic-criteo-data)): {data['train_rows']:,} training "
        f"rows and {data['heldout_rows']:,} held-out rows from an independent stream, positive rate "
        f"{data['heldout_positive_rate']:.3f}. The teacher's own probabilities reach a held-out AUC of "
        f"**{q['criteo']['test']['teacher_auc']:.4f}**: the ceiling for any model on this data."
    )
    add("")
    tables_rows = sum(data["table_rows"].values())
    add(
        f"**Model**: k = {config['factors']} factors (rows of {config['factors'] + 1} values), MLP "
        f"{'-'.join(str(h) for h in config['hidden'])}, 26 fields with one table each ({tables_rows:,} rows in all: "
        f"values seen at least {config['min_count']} times in training, plus a shared rare-value row 0), 13 dense "
        f"features through `log(1 + max(x, 0))`. Adam, learning rate {config['lr']}, batch {config['batch']}, "
        f"{_epochs(train['epochs'])} in {_duration(train['train_seconds'])} of training."
    )
    add("")
    add("| epoch | training log loss | held-out AUC | held-out log loss | training time so far |")
    add("| ---: | ---: | ---: | ---: | ---: |")
    for h in train["history"]:
        add(
            f"| {h['epoch']} | {h['train_log_loss']:.4f} | {h['heldout_auc']:.4f} | {h['heldout_log_loss']:.4f} | "
            f"{_duration(h['seconds'])} |"
        )
    add("")
    add("**Precisions** on the held-out rows (`check --deepfm-data`; differences are in probability against FP32):")
    add("")
    add("| variant | tables | dense graph | AUC | log loss | max \\|Δp\\| | mean \\|Δp\\| |")
    add("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    rows = q["check"]["deepfm"]
    for r in rows:
        diff = (
            f"{r['max_abs_diff']:.2e} | {r['mean_abs_diff']:.2e}"
            if r.get("reference") and r["variant"] != r["reference"]
            else "– | –"
        )
        add(f"| {r['variant']} | {r['tables']} | {r['graph']} | {r['auc']:.5f} | {r['log_loss']:.5f} | {diff} |")
    add("")
    fp32 = next(r for r in rows if r["tables"] == "fp32" and r["graph"] == "fp32")
    int8 = next(r for r in rows if r["tables"] == "int8" and r["graph"] == "int8" and "+" not in r["variant"])
    drop = (fp32["auc"] - int8["auc"]) * 100
    verdict = "within" if drop <= INT8_AUC_BUDGET_PP else "**outside**"
    add(
        f"INT8 (int8 tables and INT8 dense graph) against FP32: AUC {int8['auc']:.5f} against {fp32['auc']:.5f}, "
        f"a drop of **{drop:.3f} percentage points**{' (INT8 scored higher)' if drop < 0 else ''}, {verdict} the "
        f"budget of {INT8_AUC_BUDGET_PP} point."
    )
    tb = q["table_bytes"]
    ratio = tb["int8"] / tb["fp32"]
    add(
        f"Table bytes: {tb['int8']:,} int8 against {tb['fp32']:,} fp32, **{ratio:.3f}×**, "
        f"{'within' if ratio <= 0.4 else '**outside**'} the budget of 0.4×."
    )
    add("")

    g = q["lightgcn"]
    lt, ld, lc = g["training"], g["training"]["data"], g["training"]["config"]
    add("## LightGCN (recall)")
    add("")
    add(
        f"**Data**: Gowalla as split by the LightGCN paper ({ld['users']:,} users, {ld['items']:,} items, "
        f"{ld['train_interactions']:,} training and {ld['test_interactions']:,} test interactions; not committed, "
        "see `../shared/data/gowalla`)."
    )
    add("")
    add(
        f"**Model**: {lc['layers']} layers, dim {lc['dim']}, symmetric normalisation, layer mean; BPR loss with one "
        f"uniformly sampled negative per interaction, L2 {lc['reg']} on the layer-0 rows of a batch, Adam with "
        f"learning rate {lc['lr']} and batches of {lc['batch']:,}. CPU time budget: **{_epochs(lt['epochs'])}**, "
        f"which took {_duration(lt['train_seconds'])} of wall time including {_evaluations(lt['history'])} (the "
        "paper trains for about 1,000 epochs on a GPU)."
    )
    add("")
    evaluated = [h for h in lt["history"] if "recall@20" in h]
    if evaluated:
        add("| epoch | BPR loss | Recall@20 | NDCG@20 | training time so far |")
        add("| ---: | ---: | ---: | ---: | ---: |")
        for h in evaluated:
            elapsed = _duration(h["seconds"])
            add(f"| {h['epoch']} | {h['loss']:.4f} | {h['recall@20']:.4f} | {h['ndcg@20']:.4f} | {elapsed} |")
        add("")
    by_table = [r["test_users"] for r in q["check"]["lightgcn"] if r["users_from"] == "user table"]
    by_history = [r["test_users"] for r in q["check"]["lightgcn"] if r["users_from"] == "history"]
    left_out = max(by_table, default=0) - min(by_history, default=max(by_table, default=0))
    add(
        f"**Precisions** on the test split, training items excluded (`check --lightgcn-data`), over every test user "
        f"({max(by_table, default=0):,}). "
        '"History" rows embed each test user with at least one training item from those items with the history '
        "table, as the server does for a user it does not know: `e_u = (1/sqrt|H|) · Σ_{i∈H} h_i`; a test user "
        f"without training items has no history to embed and is left out of them ({left_out:,} here)."
    )
    add("")
    add("| variant | users from | user / history table | item table | Recall@20 | NDCG@20 |")
    add("| --- | --- | --- | --- | ---: | ---: |")
    for r in q["check"]["lightgcn"]:
        add(
            f"| {r['variant']} | {r['users_from']} | {r['user_storage']} | {r['item_storage']} | "
            f"{r['recall@20']:.4f} | {r['ndcg@20']:.4f} |"
        )
    paper = f"{PAPER_RECALL:.4f} | {PAPER_NDCG:.4f}"
    add(f"| LightGCN paper, He et al. 2020 (context only, not measured here) | user table | fp32 | fp32 | {paper} |")
    add("")

    if "ranker" in q:
        _pipeline_section(q, add)

    add("## The committed demo repository")
    add("")
    add("| model | what | files | size |")
    add("| --- | --- | --- | ---: |")
    for name, m in q["demo"].items():
        add(f"| `{name}` | {m['what']} | {', '.join(sorted(m['files']))} | {_mib(sum(m['files'].values()))} |")
    total = sum(sum(m["files"].values()) for m in q["demo"].values())
    add(f"| | | total | {_mib(total)} |")
    add("")
    dim = lc["dim"]
    add(
        "The fp32 LightGCN tables (and the variants above that use them) exist only in the demo's work directory: "
        f"an fp32 row of {dim} values takes {4 * dim} bytes, an int8 row {dim + 8}."
    )
    add("")
    return "\n".join(lines)
