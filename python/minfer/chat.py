"""Chat templates: the GGUF's `tokenizer.chat_template` rendered with jinja2 in a
sandbox, with the helpers templates expect.  ChatML when a model has none."""
from __future__ import annotations

import datetime

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class TemplateError(ValueError):
    pass


def render(template: str | None, messages: list[dict], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", **extra) -> str:
    try:
        from jinja2 import TemplateError as JinjaError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:  # pragma: no cover - jinja2 is a dependency
        raise TemplateError("chat templates need jinja2 (pip install jinja2)") from e

    def raise_exception(msg):
        raise TemplateError(f"chat template: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(template or CHATML).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token,
            eos_token=eos_token, **extra)
    except TemplateError:
        raise
    except JinjaError as e:
        raise TemplateError(f"chat template failed: {e}") from e


def encode(tokenizer, text: str) -> list[int]:
    """The ids of a rendered chat: special tokens parsed, the model's BOS added -- once.  Templates are given
    an empty `bos_token`, but some write the BOS text itself (Gemma's "<bos>"): the tokenizer's BOS and
    the template's would be two."""
    ids = tokenizer.encode(text, add_special=True, parse_special=True)
    bos = tokenizer.special.bos
    if tokenizer.special.add_bos and bos is not None and ids[:2] == [bos, bos]:
        del ids[0]
    return ids


def _tojson(value, indent=None, **_):
    import json

    return json.dumps(value, ensure_ascii=False, indent=indent)
