"""Which module of one side answers which module of the other, framework-free.

Each side gets a *block table* (block -> module template, ``{layer}`` for the decoder layer
index; the blocks of the alignment report: embedding, attention, mlp, layer output, final
norm), first found of:

1. a user mapping file's section for that side (``ref:`` / ``got:``, keymap-style templates);
2. the side's own table: the keymap's ``align`` section (HF folders of a known family) or the
   bundled model's hidden-state names (converted folders); dumps carry theirs in the manifest;
3. automatic: read off the recorded execution order, output shapes and names (`infer_table`).

Logits and loss come from the model's own outputs (a (batch, seq, vocab) tensor, a scalar).
`pair` resolves both tables against the recordings into `Point`s in forward order and a
`Summary` of what was paired, how, with what confidence, and what could not be.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from migrate.errors import MigrateError
from migrate.probe.recording import ROOT, display
from migrate.safeyaml import load_yaml, quote

TABLE_BLOCKS = ("embedding", "attention", "mlp", "layer output", "final norm")
_SYNONYMS = {
    "attention": {"attn", "attention", "self_attn", "self_attention", "selfattention", "mha", "sa", "mixer"},
    "mlp": {"mlp", "ffn", "feed_forward", "feedforward", "ff", "moe", "fc"},
    "embedding": {"embed", "embedding", "embeddings", "embed_tokens", "tok_embeddings", "wte", "tok",
                  "word_embeddings"},
    "norm": {"norm", "ln", "layernorm", "rmsnorm", "norm_out", "ln_f", "final_norm", "final_layernorm"},
}
_TOKEN_SYNONYMS = {  # canonical words for name similarity
    "wq": "q", "q_proj": "q", "query": "q", "wk": "k", "k_proj": "k", "key": "k", "wv": "v", "v_proj": "v",
    "value": "v", "wo": "o", "o_proj": "o", "out_proj": "o", "dense": "o", "w1": "gate", "gate_proj": "gate",
    "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down", "self_attn": "attention", "attn": "attention",
    "feed_forward": "mlp", "ffn": "mlp", "input_layernorm": "attn_norm", "attention_norm": "attn_norm",
    "ln_1": "attn_norm", "post_attention_layernorm": "mlp_norm", "ffn_norm": "mlp_norm", "ln_2": "mlp_norm",
    "embed_tokens": "embedding", "tok_embeddings": "embedding", "embed": "embedding", "rotary_emb": "rotary",
    "rope": "rotary", "norm_out": "norm", "lm_head": "head", "output_layer": "head",
}


@dataclass
class Point:
    name: str           # the report's entry name
    kind: str           # hidden | logits | loss
    block: str
    layer: int | None
    ref_key: str
    got_key: str
    ref_module: str
    got_module: str


@dataclass
class Summary:
    methods: dict = field(default_factory=dict)        # side -> how its table was found
    paired: list = field(default_factory=list)         # (block, ref module, got module, confidence, basis)
    unpaired: dict = field(default_factory=dict)       # side -> modules of layer 0 left without partner
    submodules: list = field(default_factory=list)     # (ref, got, confidence) inside layer 0
    layers: int = 0

    def lines(self) -> list[str]:
        out = [f"pairing: ref by {self.methods.get('ref')}, got by {self.methods.get('got')}; "
               f"{self.layers} decoder layers paired"]
        for block, ref, got, conf, basis in self.paired:
            out.append(f"  {block:<13} {ref} ↔ {got}  [{conf}: {basis}]")
        if self.submodules:
            out.append(f"  inside layer 0: {len(self.submodules)} submodules paired by order, shape and name")
        for side, names in self.unpaired.items():
            if names:
                out.append(f"  inside layer 0, {side} only (no partner of that shape): {', '.join(names[:8])}"
                           + (" …" if len(names) > 8 else ""))
        return out

    def to_dict(self) -> dict:
        return {"methods": self.methods, "layers": self.layers,
                "paired": [dict(zip(("block", "ref", "got", "confidence", "basis"), p, strict=True))
                           for p in self.paired],
                "submodules": [dict(zip(("ref", "got", "confidence"), p, strict=True)) for p in self.submodules],
                "unpaired": self.unpaired}


# ------------------------------------------------------------------ tables

def load_mapping(path) -> dict:
    """A mapping file: ``ref:`` and/or ``got:``, each block -> module template."""
    data = load_yaml(path, "mapping file")
    if not isinstance(data, dict) or not set(data) <= {"ref", "got"} or not data:
        raise MigrateError(f"{path}: a mapping file holds `ref:` and/or `got:` sections of block: module")
    for side, table in data.items():
        if not isinstance(table, dict):
            raise MigrateError(f"{path}: `{side}` must map blocks to module names")
        for block, template in table.items():
            if block not in TABLE_BLOCKS:
                raise MigrateError(f"{path}: unknown block {quote(block)} under {side}; "
                                   f"blocks: {', '.join(TABLE_BLOCKS)}")
            if not isinstance(template, str):
                raise MigrateError(f"{path}: {side}.{block} must be a module name (a string)")
            if block in ("attention", "mlp", "layer output") and "{layer}" not in template:
                raise MigrateError(f"{path}: {side}.{block} needs {{layer}} in its name")
    return data


def _modules(records) -> dict[str, dict]:
    """module -> its first call's primary output record (the first tensor it hands out)."""
    out: dict[str, dict] = {}
    for r in records:
        if r["io"] == "output" and r["call"] == 0 and r["module"] not in out:
            out[r["module"]] = r
    return out


def _tokens(name: str) -> set[str]:
    words = set()
    for part in re.split(r"[.]", name.lower()):
        if part.isdigit() or not part:
            continue
        words.add(_TOKEN_SYNONYMS.get(part, part))
        words.update(_TOKEN_SYNONYMS.get(w, w) for w in part.split("_") if w and not w.isdigit())
    return words


def _is(kind: str, name: str) -> bool:
    last = name.rsplit(".", 1)[-1].lower()
    return last in _SYNONYMS[kind] or any(w in _SYNONYMS[kind] for w in last.split("_"))


def infer_table(records) -> tuple[dict, dict]:
    """(block table, block -> basis) read off one recording; blocks it cannot find are absent."""
    mods = _modules(records)
    groups: dict[str, list[int]] = {}
    for name in mods:
        m = re.fullmatch(r"(.+)\.(\d+)", name)
        if m:
            groups.setdefault(m.group(1), []).append(int(m.group(2)))
    best = None
    for prefix, idx in groups.items():
        shapes = {tuple(mods[f"{prefix}.{i}"]["shape"]) for i in idx}
        if sorted(idx) == list(range(len(idx))) and len(shapes) == 1 and len(next(iter(shapes))) == 3:
            if best is None or len(idx) > len(groups[best]):
                best = prefix
    if best is None:
        return {}, {}
    table, basis = {"layer output": f"{best}.{{layer}}"}, {"layer output": "numbered siblings, one shape"}
    n = len(groups[best])
    shape = mods[f"{best}.0"]["shape"]
    first = min(r["order"] for r in records if r["module"].startswith(f"{best}.0.") or r["module"] == f"{best}.0")
    last = mods[f"{best}.{n - 1}"]["order"]
    children = [name[len(best) + 3:] for name in mods
                if name.startswith(f"{best}.0.") and "." not in name[len(best) + 3:] and mods[name]["shape"] == shape]
    for block in ("attention", "mlp"):
        named = [c for c in children if _is(block, c)]
        if len(named) == 1:
            table[block], basis[block] = f"{best}.{{layer}}.{named[0]}", "name and shape"
    plain = [c for c in children if not _is("norm", c)]
    if "attention" not in table and len(plain) >= 2:
        table["attention"] = f"{best}.{{layer}}.{plain[0]}"
        basis["attention"] = "first of the layer's blocks (order, shape)"
    if "mlp" not in table and len(plain) >= 2:
        table["mlp"] = f"{best}.{{layer}}.{plain[-1]}"
        basis["mlp"] = "last of the layer's blocks (order, shape)"
    outside = [name for name in mods if name != ROOT and not name.startswith(best + ".") and name != best
               and mods[name]["shape"] == shape]
    before = [m for m in outside if mods[m]["order"] < first]
    after = [m for m in outside if mods[m]["order"] > last]
    emb = [m for m in before if _is("embedding", m)] or before[:1]
    if emb:
        table["embedding"] = emb[0]
        basis["embedding"] = "name and shape" if _is("embedding", emb[0]) else "first module of the hidden shape"
    norms = [m for m in after if _is("norm", m)] or after[-1:]
    if norms:
        table["final norm"] = norms[-1]
        basis["final norm"] = "name and shape" if _is("norm", norms[-1]) else "last module of the hidden shape"
    return table, basis


def _side_table(records, mapping: dict | None, own: dict | None) -> tuple[dict, dict, str]:
    if mapping:
        inferred, basis = infer_table(records) if not own else (own, {})
        table = {**(own or inferred), **mapping}
        return table, {**{b: "table" for b in table}, **basis, **{b: "mapping file" for b in mapping}}, "mapping file"
    if own:
        return dict(own), {b: "keymap / model table" for b in own}, "its model's align table"
    table, basis = infer_table(records)
    return table, basis, "automatic pairing (order, shapes, names)"


# ------------------------------------------------------------------ pairing

_ENCODER_OUTPUT = "last_hidden_state"   # HF's name of an encoder's (batch, seq, hidden) output


def _outputs(records) -> tuple[dict | None, dict | None]:
    """The model's own logits (3-d; an encoder's last hidden state in their place) and loss (0-d)."""
    root = [r for r in records if r["module"] == ROOT and r["io"] == "output" and r["call"] == 0]
    logits = [r for r in root if len(r["shape"]) == 3]
    logits = [r for r in logits if "logits" in r["index"]] or logits[:1]
    loss = [r for r in root if len(r["shape"]) == 0]
    loss = [r for r in loss if "loss" in r["index"]] or loss[:1]
    return (logits[0] if logits else None), (loss[0] if loss else None)


def _count_layers(template: str, mods: dict) -> int:
    n = 0
    while template.replace("{layer}", str(n)) in mods:
        n += 1
    return n


def pair(ref_records, got_records, *, ref_align=None, got_align=None, mapping=None,
         detail: bool = False) -> tuple[list[Point], Summary]:
    """Points in forward order, and the summary; a block one side cannot place is one line
    naming it, the side, and what the mapping file needs."""
    mapping = mapping or {}
    summary = Summary()
    tables = {}
    for side, records, own in (("ref", ref_records, ref_align), ("got", got_records, got_align)):
        table, basis, method = _side_table(records, mapping.get(side), own)
        tables[side] = (table, basis, _modules(records))
        summary.methods[side] = method
    (rt, rb, rmods), (gt, gb, gmods) = tables["ref"], tables["got"]
    missing = [(side, b) for side, (t, _, _) in tables.items() for b in ("embedding", "layer output")
               if b not in t]
    if missing:
        raise MigrateError("pairing needs a mapping file (--mapping): " + "; ".join(
            f"no {b} found on the {side} side" for side, b in missing)
            + "; write e.g. `got: {layer output: blocks.{layer}, embedding: embed, ...}`")
    layers = {side: _count_layers(t["layer output"], mods) for side, (t, _, mods) in tables.items()}
    if layers["ref"] != layers["got"] or not layers["ref"]:
        raise MigrateError(f"decoder layers do not pair: ref has {layers['ref']} ({rt['layer output']}), got has "
                           f"{layers['got']} ({gt['layer output']}); give both in a mapping file")
    summary.layers = n = layers["ref"]
    points: list[Point] = []

    def add(block, layer, name):
        r = rt[block].replace("{layer}", str(layer)) if layer is not None else rt[block]
        g = gt[block].replace("{layer}", str(layer)) if layer is not None else gt[block]
        for side, module, mods in (("ref", r, rmods), ("got", g, gmods)):
            if module not in mods:
                raise MigrateError(f"the {side} side recorded no module {display(module)} ({block}"
                                   f"{'' if layer is None else f', layer {layer}'}); fix the mapping file")
        points.append(Point(name, "hidden", "layer output" if block == "layer output" else block, layer,
                            rmods[r]["key"], gmods[g]["key"], r, g))

    blocks = [b for b in ("attention", "mlp") if detail]
    unplaced = [f"{b} on the {side} side" for b in blocks for side, (t, _, _) in tables.items() if b not in t]
    if unplaced:
        raise MigrateError("--detail needs every sub-block placed; not found: " + ", ".join(unplaced)
                           + "; name them in a mapping file (--mapping)")
    add("embedding", None, "embedding output")
    for i in range(n):
        for b in blocks + ["layer output"]:
            add(b, i, f"layer {i} {b}")
    if "final norm" in rt and "final norm" in gt:
        add("final norm", None, "final norm output")
    for block in TABLE_BLOCKS:
        if block in rt and block in gt:
            conf = _confidence(rb.get(block, ""), gb.get(block, ""))
            summary.paired.append((block, rt[block], gt[block], conf,
                                   f"ref {rb.get(block, 'table')} / got {gb.get(block, 'table')}"))
    (rlog, rloss), (glog, gloss) = _outputs(ref_records), _outputs(got_records)
    if rlog and glog:
        if any(_ENCODER_OUTPUT in r["index"] for r in (rlog, glog)):  # an encoder (BertModel) has no logits
            points.append(Point("last hidden state", "hidden", "last hidden state", None, rlog["key"], glog["key"],
                                ROOT, ROOT))
        else:
            points.append(Point("logits", "logits", "logits", None, rlog["key"], glog["key"], ROOT, ROOT))
    if rloss and gloss:
        points.append(Point("loss", "loss", "loss", None, rloss["key"], gloss["key"], ROOT, ROOT))
    _pair_submodules(summary, rt["layer output"].replace("{layer}", "0"), rmods,
                     gt["layer output"].replace("{layer}", "0"), gmods)
    return points, summary


def _confidence(ref_basis: str, got_basis: str) -> str:
    weak = [b for b in (ref_basis, got_basis) if "order" in b or "first" in b or "last" in b]
    return "medium" if weak else "high"


def _pair_submodules(summary: Summary, ref_layer: str, rmods: dict, got_layer: str, gmods: dict) -> None:
    """Inside layer 0: align the two sides' submodules in execution order (longest common
    subsequence of equal output shapes, ties broken by name similarity)."""
    def inside(layer, mods):
        return sorted((m for m in mods if m.startswith(layer + ".")), key=lambda m: mods[m]["order"])
    a, b = inside(ref_layer, rmods), inside(got_layer, gmods)
    ra = [m[len(ref_layer) + 1:] for m in a]
    gb = [m[len(got_layer) + 1:] for m in b]
    score = [[0.0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            best = max(score[i + 1][j], score[i][j + 1])
            if rmods[a[i]]["shape"] == gmods[b[j]]["shape"]:
                ta, tb = _tokens(ra[i]), _tokens(gb[j])
                sim = len(ta & tb) / max(len(ta | tb), 1)
                best = max(best, score[i + 1][j + 1] + 1 + sim)
            score[i][j] = best
    i = j = 0
    used_a, used_b = set(), set()
    while i < len(a) and j < len(b):
        if rmods[a[i]]["shape"] == gmods[b[j]]["shape"]:
            ta, tb = _tokens(ra[i]), _tokens(gb[j])
            sim = len(ta & tb) / max(len(ta | tb), 1)
            if abs(score[i][j] - (score[i + 1][j + 1] + 1 + sim)) < 1e-9:
                conf = "high" if sim >= 0.5 else ("medium" if sim > 0 else "low")
                summary.submodules.append((ra[i], gb[j], conf))
                used_a.add(i)
                used_b.add(j)
                i, j = i + 1, j + 1
                continue
        if score[i + 1][j] >= score[i][j + 1]:
            i += 1
        else:
            j += 1
    summary.unpaired = {"ref": [ra[k] for k in range(len(a)) if k not in used_a],
                        "got": [gb[k] for k in range(len(b)) if k not in used_b]}
