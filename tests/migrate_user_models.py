"""A user's own MindSpore model class, importable from the tests folder (not bundled by migrate)."""
from migrate.models.llama import LlamaForCausalLM


class MyLlama(LlamaForCausalLM):
    """The bundled Llama under another name: a class migrate has not registered."""
