"""Reading an OpenAI request body: the messages as a question or conversation, the parameters as AskOptions.

Every parameter OpenAI's chat and completions APIs define is known here. Those the server honours are read
(sampling, length, stop, n, log-probs, JSON output); the rest are accepted at their neutral value (null, 0, an
empty list, "auto") and refused otherwise with 400 ``unsupported`` naming the field, so a framework's defaults
pass and a real request for something not done here is never silently ignored. A name OpenAI does not define is
400 ``unknown_parameter``. See the module docstring of openai_compat for the surface.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from core.errors import MnesioError
from kvengine.decoding import MAX_STOPS, MAX_TOP_LOGPROBS, Decoding

from .. import services

MAX_N = 4  # choices per request, on the shared cartridge prefix (sampled ones are decoded together, a batch row each)
COMMON = ("model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "n", "user", "seed", "stop",
          "presence_penalty", "frequency_penalty", "logit_bias", "logprobs")
CHAT = (*COMMON, "messages", "max_completion_tokens", "top_logprobs", "response_format", "tools", "tool_choice",
        "parallel_tool_calls", "functions", "function_call", "store", "metadata", "service_tier", "modalities",
        "reasoning_effort", "audio", "prediction", "web_search_options", "verbosity", "safety_identifier",
        "prompt_cache_key", "prompt_cache_retention")
COMPLETIONS = (*COMMON, "prompt", "echo", "best_of", "suffix")
# accepted only at these values (null always): anything else is refused as unsupported
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0,), "frequency_penalty": (0,), "logit_bias": ({},), "tools": ([],), "functions": ([],),
    "tool_choice": ("none", "auto"), "function_call": ("none", "auto"), "store": (False,), "service_tier": ("auto", "default"),
    "modalities": (["text"],), "reasoning_effort": (), "audio": (), "prediction": (), "web_search_options": (), "verbosity": (),
    "echo": (False,), "best_of": (1,), "suffix": (), "prompt_cache_retention": (),
}
IGNORED_TEXT = ("user", "safety_identifier", "prompt_cache_key")  # strings with no effect here (never logged)
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class InvalidRequest(MnesioError):
    """A request OpenAI's API would refuse too: 400 naming ``param`` (and an OpenAI ``code``)."""

    def __init__(self, message: str, *, param: str | None, code: str | None = None, status_code: int = 400):
        super().__init__(message, extra={"field": param, "code": code}, status_code=status_code)


def unsupported(param: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"`{param}` {what} is not supported by this server", param=param, code="unsupported")


@dataclass(frozen=True)
class Parsed:
    """A checked request: the options common to both endpoints."""

    model: str
    stream: bool
    include_usage: bool
    n: int
    options: services.AskOptions


def _number(data: dict, name: str, low: float, high: float, *, low_open: bool = False) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value > high or value < low or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise InvalidRequest(f"`{name}` has to be a number in {bound} but got {value!r}", param=name, code="invalid_value")
    return float(value)


def _whole(data: dict, name: str, low: int, high: int | None = None) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise InvalidRequest(f"`{name}` has to be a whole number {bound} but got {value!r}", param=name, code="invalid_value")
    return value


def _check_names(data: dict, accepted: tuple[str, ...]) -> None:
    for name in data:
        if name not in accepted:
            raise InvalidRequest(f"Unrecognized request argument supplied: {name}", param=name, code="unknown_parameter")
    for name, values in NEUTRAL.items():
        value = data.get(name)
        if value is not None and not any(_same(value, v) for v in values):
            raise unsupported(name, f"= {json.dumps(value)[:80]}")
    for name in IGNORED_TEXT:
        if data.get(name) is not None and not isinstance(data[name], str):
            raise InvalidRequest(f"`{name}` has to be a string", param=name, code="invalid_type")
    if data.get("metadata") is not None and not isinstance(data["metadata"], dict):
        raise InvalidRequest("`metadata` has to be an object", param="metadata", code="invalid_type")
    if data.get("parallel_tool_calls") is not None and not isinstance(data["parallel_tool_calls"], bool):
        raise InvalidRequest("`parallel_tool_calls` has to be true or false", param="parallel_tool_calls", code="invalid_type")


def _same(value: object, neutral: object) -> bool:
    """``value`` is ``neutral`` (numbers by value, 0 == 0.0; a bool is no number)."""
    if isinstance(neutral, (int, float)) and not isinstance(neutral, bool):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == neutral
    return type(value) is type(neutral) and value == neutral


def _stop(data: dict) -> tuple[str, ...]:
    stop = data.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise InvalidRequest(f"`stop` has to be a non-empty string or a list of at most {MAX_STOPS} of them but got {stop!r}",
                             param="stop", code="invalid_value")
    return tuple(stops)


def _json_schema(data: dict) -> str | None:
    """The schema a response_format asks for: canonical JSON ("{}": any JSON object), or None for text."""
    fmt = data.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(schema, dict):
            raise InvalidRequest("`response_format.json_schema` has to be {\"name\": ..., \"schema\": {...}}",
                                 param="response_format", code="invalid_value")
        _check_schema(schema)
        return json.dumps(schema, sort_keys=True)
    raise InvalidRequest(f"`response_format.type` has to be one of ['text', 'json_object', 'json_schema'] but got {kind!r}",
                         param="response_format", code="invalid_value")


def _schema_refusal(problem: str) -> InvalidRequest:
    return InvalidRequest(f"`response_format.json_schema.schema` {problem}", param="response_format", code="invalid_value")


def _check_schema(schema: dict) -> None:
    """Refuse a schema the JSON constraint (kvengine/sampling.py, lm-format-enforcer) cannot be built from, here and
    not in the engine: there it failed as a 500, or mid-stream. Checked with jsonschema (the schema against its
    draft's metaschema) rather than the enforcer itself, which imports torch (a model-free web process never does);
    what the metaschema allows but the enforcer's own model refuses is refused by the engine (engine_refused)."""
    from jsonschema import SchemaError
    from jsonschema.validators import Draft202012Validator, validator_for

    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(the root)"
        raise _schema_refusal(f"is not a valid JSON schema at {where}: {exc.message[:200]}") from None
    except RecursionError:
        raise _schema_refusal("is nested too deeply") from None
    # references are followed as the enforcer follows them: by the last segment, in the root's definitions
    definitions = schema.get("definitions") if "definitions" in schema else schema.get("$defs")
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and not (re.fullmatch(r"#/(\$defs|definitions)/[^/]+", ref)
                                             and isinstance(definitions, dict) and ref.rsplit("/", 1)[1] in definitions):
                raise _schema_refusal(f"has `$ref` {ref[:100]!r}: only references to the schema's own `$defs` "
                                      "(or `definitions`) are supported")
            stack.extend(node.values())


def parse(data: dict[str, Any], *, chat: bool) -> Parsed:
    """Check every parameter of a chat (``chat``) or completions request; return what the answer needs."""
    _check_names(data, CHAT if chat else COMPLETIONS)
    if not isinstance(data.get("model"), str) or not data["model"]:
        raise InvalidRequest("`model` has to be the name of a scope (GET /v1/models lists yours)", param="model")
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest(f"`stream` has to be true or false but got {stream!r}", param="stream", code="invalid_type")
    include_usage = False
    if data.get("stream_options") is not None:
        opts = data["stream_options"]
        if not stream or not isinstance(opts, dict) or set(opts) - {"include_usage", "include_obfuscation"} \
                or not all(isinstance(v, bool) for v in opts.values()):
            raise InvalidRequest("`stream_options` has to be {\"include_usage\": true|false}, with stream true",
                                 param="stream_options")
        include_usage = opts.get("include_usage", False)
    temperature = _number(data, "temperature", 0, 2)
    top_p = _number(data, "top_p", 0, 1, low_open=True)
    n = _whole(data, "n", 1, MAX_N) or 1
    seed = _whole(data, "seed", -(2**63), 2**63 - 1)
    lengths = [v for v in (_whole(data, "max_tokens", 1), _whole(data, "max_completion_tokens", 1) if chat else None) if v]
    logprobs, top = _logprobs(data, chat=chat)
    if stream and logprobs:
        raise unsupported("logprobs", "with stream true")
    if stream and n > 1:
        raise unsupported("n", f"= {n} with stream true")
    decoding = Decoding(temperature=temperature or 0.0, top_p=1.0 if top_p is None else top_p,
                        seed=None if seed is None else seed % 2**63, stop=_stop(data), logprobs=logprobs, top_logprobs=top,
                        json_schema=_json_schema(data) if chat else None)
    options = services.AskOptions(decoding=decoding, max_new_tokens=min(lengths) if lengths else None)
    return Parsed(model=data["model"], stream=bool(stream), include_usage=include_usage, n=n, options=options)


def _logprobs(data: dict, *, chat: bool) -> tuple[bool, int]:
    if not chat:  # completions: logprobs is the number of alternatives (0 to 5)
        value = _whole(data, "logprobs", 0, 5)
        return value is not None, value or 0
    value = data.get("logprobs")
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"`logprobs` has to be true or false but got {value!r}", param="logprobs", code="invalid_type")
    top = _whole(data, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not value:
        raise InvalidRequest("`top_logprobs` needs `logprobs` true", param="top_logprobs", code="invalid_value")
    return bool(value), top or 0


def _text(content: object, param: str) -> str:
    if isinstance(content, list):
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise unsupported(param, f"part of type {kind!r} (only text parts)")
        content = "\n".join(part["text"] for part in content)
    if not isinstance(content, str) or not content.strip():
        raise InvalidRequest(f"`{param}` has to be non-empty text", param=param)
    return content


def prompt(messages: object):
    """The question (last user message) or the conversation the messages hold (services.prompt_build).

    System and developer messages make the client's system text (joined, in order); user and assistant
    messages the turns. Tools are not supported, so tool messages and assistant tool calls are refused.
    """
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("`messages` has to be a non-empty list of {role, content} objects", param="messages")
    system, turns = [], []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise InvalidRequest(f"`messages[{i}]` has to be an object whose `role` is one of {list(ROLES)}",
                                 param=f"messages[{i}]")
        role = message["role"]
        if role in ("tool", "function"):
            raise unsupported(f"messages[{i}].role", f"'{role}' (tools are not supported)")
        if message.get("tool_calls") or message.get("function_call"):
            raise unsupported(f"messages[{i}].tool_calls", "(tools are not supported)")
        text = _text(message.get("content"), f"messages[{i}].content")
        if role in ("system", "developer"):
            system.append(text.strip())
        else:
            turns.append((i, role, text))
    last = len(messages) - 1
    if not turns or turns[-1][0] != last:
        raise InvalidRequest(f"the last message has to be the user's question but its role is '{messages[-1]['role']}'",
                             param=f"messages[{last}].role")
    if turns[-1][1] != "user":
        raise InvalidRequest(f"the last message has to be the user's question but its role is '{turns[-1][1]}'",
                             param=f"messages[{last}].role")
    if turns[0][1] != "user":
        raise InvalidRequest(f"the first message after the system messages has to be the user's but its role is "
                             f"'{turns[0][1]}'", param=f"messages[{turns[0][0]}].role")
    return services.prompt_build(question=turns[-1][2], history=[(role, text) for _, role, text in turns[:-1]],
                                 system="\n\n".join(system), history_field="messages")


def completion_prompt(value: object) -> str:
    """The prompt of a completions request, read as one user question."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest("`prompt` has to be non-empty text (one prompt per request)", param="prompt")
    return value
