"""`migrate lora`: adapters between PEFT and the converted MindSpore model (export, import, merge).

Argument parsing only; each subcommand calls one function of `migrate.lora.transfer`, imported
inside its function as in `migrate.cli`. Registered into the main parser by `migrate.cli`.
"""
from __future__ import annotations


def _cmd_export(args) -> int:
    from migrate.lora.transfer import export_adapter
    from migrate.ui import console

    out = export_adapter(args.adapter, args.out, ms_model=args.model, overwrite=args.overwrite)
    console().print(f"[green]exported[/] {args.adapter} -> {out} (PEFT: adapter_config.json, "
                    f"adapter_model.safetensors)")
    return 0


def _cmd_import(args) -> int:
    from migrate.lora.transfer import import_adapter
    from migrate.ui import console

    out = import_adapter(args.peft_dir, args.model, args.out, overwrite=args.overwrite)
    console().print(f"[green]imported[/] {args.peft_dir} onto {args.model} -> {out} (adapter.ckpt, lora.json)")
    return 0


def _cmd_merge(args) -> int:
    from migrate.lora.transfer import merge_adapter
    from migrate.ui import console

    out = merge_adapter(args.adapter, args.out, ms_model=args.model, overwrite=args.overwrite)
    console().print(f"[green]merged[/] {args.adapter} -> {out} (a converted folder: `migrate export` writes it as HF)")
    return 0


def register(sub) -> None:
    lora = sub.add_parser("lora", help="LoRA adapters: PEFT <-> MindSpore, merge into the base")
    lora_sub = lora.add_subparsers(dest="lora_command", required=True)
    p = lora_sub.add_parser("export", help="a LoRA run's adapter -> a PEFT folder PeftModel.from_pretrained loads")
    p.add_argument("adapter", help="a LoRA run's checkpoint (RUN/checkpoints/latest), run folder or adapter folder")
    p.add_argument("out", help="output PEFT folder")
    p.add_argument("--model", help="the converted base (default: the one the adapter records)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_cmd_export)

    p = lora_sub.add_parser("import", help="a PEFT adapter folder -> a MindSpore adapter on the converted model")
    p.add_argument("peft_dir", help="folder with adapter_config.json and adapter_model.safetensors")
    p.add_argument("out", help="output adapter folder (adapter.ckpt, lora.json)")
    p.add_argument("--model", required=True, help="the converted base model folder")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_cmd_import)

    p = lora_sub.add_parser("merge", help="base + scaling·B·A -> a converted folder (HF through `migrate export`)")
    p.add_argument("adapter", help="a MindSpore adapter (folder, LoRA checkpoint, run folder) or a PEFT folder")
    p.add_argument("out", help="output model folder")
    p.add_argument("--model", help="the converted base (default: the one the adapter records; required for PEFT)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=_cmd_merge)
