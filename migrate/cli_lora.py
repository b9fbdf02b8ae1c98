"""`migrate lora`: adapters between PEFT and the converted MindSpore model (export, import, merge).

Argument parsing only; each subcommand calls one function of `migrate.lora.transfer`, imported
inside its function as in `migrate.cli`. Each verb is declared at its handler (`migrate.cli_verbs`).
"""
from __future__ import annotations

from migrate.cli_verbs import Output, arguments, group, trust_argument, verb

group("lora", "LoRA adapters: PEFT <-> MindSpore, merge into the base", dest="lora_command")


@verb("lora export", "a LoRA run's adapter -> a PEFT folder PeftModel.from_pretrained loads",
      writes=(Output("out"),), reads=("adapter", "model"))
def _cmd_export(args) -> int:
    from migrate.lora.transfer import export_adapter
    from migrate.ui import console

    out = export_adapter(args.adapter, args.out, ms_model=args.model, overwrite=args.overwrite,
                         trust=args.trust_model_class)
    console().print(f"[green]exported[/] {args.adapter} -> {out} (PEFT: adapter_config.json, "
                    f"adapter_model.safetensors)")
    return 0


@arguments("lora export")
def _lora_export_arguments(p) -> None:
    p.add_argument("adapter", help="a LoRA run's checkpoint (RUN/checkpoints/latest), run folder or adapter folder")
    p.add_argument("out", help="output PEFT folder")
    p.add_argument("--model", help="the converted base (default: the one the adapter records)")
    p.add_argument("--overwrite", action="store_true")
    trust_argument(p)


@verb("lora import", "a PEFT adapter folder -> a MindSpore adapter on the converted model",
      writes=(Output("out"),), reads=("peft_dir", "model"))
def _cmd_import(args) -> int:
    from migrate.lora.transfer import import_adapter
    from migrate.ui import console

    out = import_adapter(args.peft_dir, args.model, args.out, overwrite=args.overwrite, trust=args.trust_model_class)
    console().print(f"[green]imported[/] {args.peft_dir} onto {args.model} -> {out} (adapter.ckpt, lora.json)")
    return 0


@arguments("lora import")
def _lora_import_arguments(p) -> None:
    p.add_argument("peft_dir", help="folder with adapter_config.json and adapter_model.safetensors")
    p.add_argument("out", help="output adapter folder (adapter.ckpt, lora.json)")
    p.add_argument("--model", required=True, help="the converted base model folder")
    p.add_argument("--overwrite", action="store_true")
    trust_argument(p)


@verb("lora merge", "base + scaling·B·A -> a converted folder (HF through `migrate export`)",
      writes=(Output("out"),), reads=("adapter", "model"))
def _cmd_merge(args) -> int:
    from migrate.lora.transfer import merge_adapter
    from migrate.ui import console

    out = merge_adapter(args.adapter, args.out, ms_model=args.model, overwrite=args.overwrite,
                        trust=args.trust_model_class)
    console().print(f"[green]merged[/] {args.adapter} -> {out} (a converted folder: `migrate export` writes it as HF)")
    return 0


@arguments("lora merge")
def _lora_merge_arguments(p) -> None:
    p.add_argument("adapter", help="a MindSpore adapter (folder, LoRA checkpoint, run folder) or a PEFT folder")
    p.add_argument("out", help="output model folder")
    p.add_argument("--model", help="the converted base (default: the one the adapter records; required for PEFT)")
    p.add_argument("--overwrite", action="store_true")
    trust_argument(p)
