"""Chat templates: render a conversation, locate each message in the rendering, encode it with masks.

Spans are located by character offsets, never by searching for marker tokens:

1. Every message's content is replaced by a placeholder (private-use characters and the message's index,
   keeping the content's leading/trailing whitespace so a template's `|trim` acts the same) and the
   conversation is rendered with the template. The placeholders' positions in that skeleton are the
   messages' positions. Substituting the contents back must give exactly the template's rendering of the
   real conversation; otherwise the record is rejected (`chat_template_mismatch`), as it is when the
   template drops or repeats a message (`chat_template_dropped_message`).
2. The end of a trained turn: the conversation up to and including that message is rendered on its own;
   what the template emits right after the message there, up to trailing whitespace, is the turn's
   end-of-turn text (`<|im_end|>`, `</s>`, `<|eot_id|>`) where the full rendering continues with it. It is
   trained with the content.
3. Encoding: the rendering is split at the special tokens the *template* emitted (looked for only in the
   template's own text, never in content); the text between them is encoded with special-token strings as
   plain text, the first piece as the start of the input and later pieces as continuations, which is how
   the tokenizer encodes the whole rendering. Each token carries the characters it covers; a token is
   trained when it covers a trained character.

Tools are passed to the template (`tools=`) where the record has them; a template that leaves them out is
rejected (`chat_template_dropped_tools`). Templates render in transformers' sandboxed Jinja environment, each
render under a time limit (a watchdog thread) and a size limit; no custom code runs.

4. The encoding is also cut at each trained turn's start and end and at the end of each assistant turn's
   generation prompt, so the ids of the history rendered for generation are a prefix of the sequence and no
   token joins template text to trained text (the ids differ from `tokenizer(rendering)` only where a merge
   spans such a cut: `EncodedChat.split`). A history the template renders differently for generation than
   inside the conversation is rejected (`chat_template_history_differs`).
"""

from __future__ import annotations

import bisect
import json
import os
import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from prep_assets.core.errors import TokenizerError
from prep_assets.core.records import TYPE_COMPLETION, TYPE_EOS, TYPE_PROMPT, Invalid
from prep_assets.core.render_guard import RENDER_SECONDS, RenderGuard, RenderTimeout
from prep_assets.core.tokenizer import PinnedTokenizer

_MARK_CHARS = (("\ue000", "\ue001"), ("\U000f0000", "\U000f0001"), ("\U00100000", "\U00100001"))
RENDER_MIN_CHARS = 4 << 20  # a rendering may be this long, or RENDER_INPUT_FACTOR x the conversation's characters
RENDER_INPUT_FACTOR = 16
TIME_LIMITS_IN_A_ROW = 5  # then the template, not a record, is at fault: gold stops instead of taking hours
_TEMPLATE_SOURCE_HINT = "tokenizer.chat_template (inline Jinja) or tokenizer.chat_template_file"


@dataclass(frozen=True)
class RenderedChat:
    """A rendering with the character spans that train, split into content (type 1) and end-of-turn (type 3)."""

    text: str
    content_spans: list[tuple[int, int]]  # every message's characters (trained or not): not template text
    trained_content: list[tuple[int, int]]
    trained_eot: list[tuple[int, int]]
    cuts: tuple[int, ...] = ()  # sorted: the encoding never merges across these (trained turns' edges)


@dataclass(frozen=True)
class EncodedChat:
    token_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8
    token_type_ids: np.ndarray  # uint8
    char_ends: np.ndarray  # int64: the character (of the rendering) each token ends at
    split: bool = False  # the cuts changed the ids: they differ from the tokenizer's encoding of the rendering


class TemplateRenderLimit(Exception):
    """A render stopped by the time or size limit."""


class ChatTemplate:
    """The pinned tokenizer's chat template (or the spec's), rendered through transformers."""

    def __init__(
        self, pt: PinnedTokenizer, template: str | None = None, *, render_seconds: float = RENDER_SECONDS
    ) -> None:
        self.pt = pt
        self.template = template
        if template is None and not getattr(pt.hf, "chat_template", None):
            raise TokenizerError(
                "the tokenizer has no chat template; give tokenizer.chat_template (inline Jinja) or "
                "tokenizer.chat_template_file (e.g. a ChatML template) in the dataset spec"
            )
        source = template if template is not None else pt.hf.chat_template
        self.source = source if isinstance(source, str) else json.dumps(source)
        added = sorted(pt.hf.backend_tokenizer.get_added_tokens_decoder().items())
        self.added_ids = {tok.content: int(i) for i, tok in added}
        contents = sorted(self.added_ids, key=lambda c: (-len(c), c))
        self._added_re = re.compile("|".join(map(re.escape, contents))) if contents else None
        self.guard = RenderGuard(render_seconds)
        self._time_limits_in_a_row = 0

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's rendering; raises TemplateRenderLimit past the time or size limit."""

        def run() -> str:
            return self.pt.hf.apply_chat_template(
                messages,
                tools=tools,
                chat_template=self.template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )

        try:
            out = self.guard.run(run)
        except RenderTimeout:
            self._time_limits_in_a_row += 1
            if self._time_limits_in_a_row >= TIME_LIMITS_IN_A_ROW:
                raise TokenizerError(
                    f"the chat template did not finish rendering within {self.guard.seconds:g} s "
                    f"for {self._time_limits_in_a_row} conversations in a row (time limit exceeded); "
                    f"fix its loops ({_TEMPLATE_SOURCE_HINT})"
                ) from None
            raise TemplateRenderLimit(
                f"the chat template did not finish rendering within {self.guard.seconds:g} s "
                "(time limit exceeded); fix the template's loops"
            ) from None
        self._time_limits_in_a_row = 0
        assert isinstance(out, str)
        size = sum(len(m.get("content") or "") for m in messages) + len(json.dumps(tools or []))
        cap = max(RENDER_MIN_CHARS, RENDER_INPUT_FACTOR * size)
        if len(out) > cap:
            raise TemplateRenderLimit(
                f"the chat template rendered {len(out):,} characters for {size:,} characters "
                f"of conversation (size limit {cap:,} exceeded); fix the template"
            )
        return out

    def _try_render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool = False,
    ) -> str | Invalid:
        try:
            return self.render(messages, tools, add_generation_prompt=add_generation_prompt)
        except TemplateRenderLimit as exc:
            return Invalid("chat_template_error", str(exc))
        except TokenizerError:  # fatal: the template cannot render this dataset
            raise
        except Exception as exc:  # Jinja raises TemplateError, raise_exception() and type errors alike
            roles = [m.get("role") for m in messages]
            return Invalid(
                "chat_template_error",
                f"the chat template cannot render this conversation (roles "
                f"{roles[:12]}{'...' if len(roles) > 12 else ''}): {exc}",
            )

    def spans(
        self, messages: list[dict[str, str]], trained: list[bool], tools: list[dict[str, Any]] | None = None
    ) -> RenderedChat | Invalid:
        """Render the conversation and locate every message, and the trained turns with their end of turn."""
        if tools and self._added_re is not None:
            hit = self._added_re.search(json.dumps(tools, ensure_ascii=False))
            if hit:  # the template writes tools as its own text: a special string there would become a token
                return Invalid(
                    "special_token_in_tools",
                    f"the tool definitions contain the special-token string "
                    f"{hit.group()!r}, which the template would emit as a real special token",
                )
        texts = [m["content"] for m in messages]
        marks = _marks(texts)
        if marks is None:
            return Invalid("chat_template_mismatch", "content holds every placeholder character we could use")
        open_, close = marks
        cores = [t.strip() for t in texts]
        leads = [t[: len(t) - len(t.lstrip())] for t in texts]
        trails = [t[len(t.rstrip()) :] if t.strip() else "" for t in texts]  # whitespace-only: all of it is lead
        holders = [f"{lead}{open_}{i}{close}{trail}" for i, (lead, trail) in enumerate(zip(leads, trails))]
        skeleton = self._try_render(_with_contents(messages, holders), tools)
        if isinstance(skeleton, Invalid):
            return skeleton
        found = list(re.finditer(re.escape(open_) + r"(\d+)" + re.escape(close), skeleton))
        if [int(m.group(1)) for m in found] != list(range(len(messages))):
            return Invalid(
                "chat_template_dropped_message",
                _dropped_detail(messages, [int(m.group(1)) for m in found], self.source),
            )
        if tools:
            dropped = self._dropped_tools(messages, holders, tools, skeleton)
            if dropped is not None:
                return dropped
        # rebuild the real rendering from the skeleton, remembering where each message lands
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        core_starts: list[int] = []
        mark_ends: list[int] = []
        cursor = 0
        length = 0
        for i, m in enumerate(found):
            lead = _kept_edge(skeleton, m.start(), leads[i], before=True)
            trail = _kept_edge(skeleton, m.end(), trails[i], before=False)
            between = skeleton[cursor : m.start() - len(lead)]
            parts += [between, lead + cores[i] + trail]
            start = length + len(between)
            length = start + len(lead) + len(cores[i]) + len(trail)
            spans.append((start, length))
            core_starts.append(start + len(lead))
            cursor = m.end() + len(trail)
            mark_ends.append(cursor)
        parts.append(skeleton[cursor:])
        text = "".join(parts)
        real = self._try_render(messages, tools)
        if isinstance(real, Invalid):
            return real
        if real != text:
            empty = [i + 1 for i, t in enumerate(texts) if not t.strip()]
            if empty:  # the skeleton's placeholders are never empty, so a test on emptiness differs only here
                return Invalid(
                    "chat_template_mismatch",
                    f"messages {empty} are empty and the template renders empty messages differently "
                    "(it skips them); drop empty messages from the records, or give a template that "
                    f"renders them ({_TEMPLATE_SOURCE_HINT})",
                )
            return Invalid(
                "chat_template_mismatch",
                "the template changes message content (it rewrites, escapes or reorders it), so its "
                "characters cannot be located; give a template that writes each content as it is or "
                f"trimmed ({_TEMPLATE_SOURCE_HINT})",
            )
        trained_content: list[tuple[int, int]] = []
        trained_eot: list[tuple[int, int]] = []
        cuts: set[int] = set()
        for i in (i for i, t in enumerate(trained) if t):
            partial = self._try_render(_with_contents(messages[: i + 1], holders[: i + 1]), tools)
            if isinstance(partial, Invalid):
                return partial
            mark = f"{open_}{i}{close}"
            at = partial.rfind(mark)
            after = partial[at + len(mark) :] if at >= 0 else ""
            eot = _common_prefix(after, skeleton[found[i].end() :])
            eot = eot[mark_ends[i] - found[i].end() :].rstrip()  # past the content's own trailing whitespace
            start = self._turn_start(messages, i, tools, real, spans, core_starts, cuts)
            if isinstance(start, Invalid):
                return start
            trained_content.append((start, spans[i][1]))
            if eot:
                trained_eot.append((spans[i][1], spans[i][1] + len(eot)))
            cuts.update((start, spans[i][1] + len(eot)))  # no token joins template text to trained text
        return RenderedChat(text, spans, trained_content, trained_eot, tuple(sorted(cuts)))

    def _dropped_tools(
        self, messages: list[dict[str, str]], holders: list[str], tools: list[dict[str, Any]], skeleton: str
    ) -> Invalid | None:
        """Tools given but not in the rendering: the skeleton holds no content, so any name found is the template's."""
        names = [n for n in (_tool_name(t) for t in tools) if n]
        if names:
            missing = [n for n in names if n not in skeleton and json.dumps(n)[1:-1] not in skeleton]
        else:  # nameless tools: the rendering must change when they are given
            missing = ["(unnamed)"] if skeleton == self._try_render(_with_contents(messages, holders), None) else []
        if not missing:
            return None
        return Invalid(
            "chat_template_dropped_tools",
            f"the record gives {len(tools)} tool definition(s) but the chat template's rendering leaves "
            f"out {missing[:5]} (the template ignores `tools`, or renders them only in some "
            "conversations); "
            f"give a template that renders tools ({_TEMPLATE_SOURCE_HINT}, e.g. data/templates/"
            "chatml.jinja), or stop reading tools (input.tools_key)",
        )

    def _turn_start(
        self,
        messages: list[dict[str, Any]],
        i: int,
        tools: list[dict[str, Any]] | None,
        real: str,
        spans: list[tuple[int, int]],
        core_starts: list[int],
        cuts: set[int],
    ) -> int | Invalid:
        """Where an assistant turn's trained characters start: right after the generation prompt.

        The history rendered with add_generation_prompt=True must be a prefix of the conversation (else the
        turn is trained on a context inference never gives it: rejected); its end is a cut. Whitespace the
        template writes between the generation prompt and the content (Mistral's space before the answer) is
        generated by the model at inference, so it trains; whitespace that is part of the generation prompt
        (a header's blank line before a trimmed content) stays masked. A template without a generation prompt
        starts the turn at the content's own start.
        """
        if messages[i]["role"] != "assistant" or i == 0:
            return spans[i][0]
        prompt = self._try_render(messages[:i], tools, add_generation_prompt=True)
        if isinstance(prompt, Invalid):
            return Invalid(
                prompt.reason,
                f"the history before message {i + 1} (assistant), rendered for generation: {prompt.detail}",
            )
        if not real.startswith(prompt):
            at = len(os.path.commonprefix([real, prompt]))
            return Invalid(
                "chat_template_history_differs",
                f"the template renders the history before message {i + 1} (assistant) for generation "
                f"differently from the same history inside the conversation (from character {at}: "
                f"{prompt[at : at + 40]!r} vs {real[at : at + 40]!r}), so this turn would be trained on a "
                "context inference never gives it (Mistral's template moves the tools and the system "
                "prompt to the last user message); give a template that renders the history in place "
                f"({_TEMPLATE_SOURCE_HINT}) or split the conversation into one record per assistant turn",
            )
        cuts.add(len(prompt))
        if spans[i - 1][1] <= len(prompt) <= core_starts[i] and not real[len(prompt) : core_starts[i]].strip():
            return len(prompt)
        return spans[i][0]

    def encode(self, rendered: list[RenderedChat]) -> list[EncodedChat]:
        """Token ids, loss masks and token types of renderings, encoded in one batch (two when input starts encode
        differently from continuations).

        The text between the template's special tokens is cut at `RenderedChat.cuts`; where that changes the
        ids (a merge spans a cut), the example is flagged `split`, found by also encoding the uncut text."""
        jobs: list[tuple[int, int, int]] = []  # (record, start, end) of text pieces
        wholes: list[tuple[int, int, int, int, int]] = []  # uncut text, its pieces' jobs: to compare
        specials: list[list[tuple[int, int, int]]] = [[] for _ in rendered]  # (start, end, id)
        for r, rc in enumerate(rendered):
            cursor = 0
            for s, e in [*_template_specials(rc, self._added_re), (len(rc.text), len(rc.text))]:
                if s > cursor:
                    inner = rc.cuts[bisect.bisect_right(rc.cuts, cursor) : bisect.bisect_left(rc.cuts, s)]
                    bounds = [cursor, *inner, s]
                    if inner:
                        wholes.append((r, cursor, s, len(jobs), len(jobs) + len(bounds) - 1))
                    jobs += [(r, a, b) for a, b in pairwise(bounds)]
                if e > s:
                    specials[r].append((s, e, self.added_ids[rc.text[s:e]]))
                cursor = e
        n_pieces = len(jobs)
        jobs += [w[:3] for w in wholes]
        if self.pt.continuation is self.pt.encoder:  # starts encode like continuations: one call
            groups = [(list(range(len(jobs))), self.pt.encoder)]
        else:
            groups = [
                ([i for i, p in enumerate(jobs) if p[1] == 0], self.pt.encoder),
                ([i for i, p in enumerate(jobs) if p[1] != 0], self.pt.continuation),
            ]
        encodings: list[Any] = [None] * len(jobs)
        for group, encoder in groups:
            texts = [rendered[jobs[i][0]].text[jobs[i][1] : jobs[i][2]] for i in group]
            for i, enc in zip(group, self.pt.encode_offsets(encoder, texts), strict=True):
                encodings[i] = enc
        per_record: list[list[tuple[int, int, int]]] = [list(s) for s in specials]
        for (r, start, _), enc in zip(jobs[:n_pieces], encodings[:n_pieces], strict=True):
            per_record[r].extend((start + a, start + b, t) for t, (a, b) in zip(enc.ids, enc.offsets, strict=True))
        split = [False] * len(rendered)
        for (r, _, _, lo, hi), enc in zip(wholes, encodings[n_pieces:], strict=True):
            split[r] = split[r] or [t for j in range(lo, hi) for t in encodings[j].ids] != enc.ids
        return [_masked(rc, toks, sp) for rc, toks, sp in zip(rendered, per_record, split, strict=True)]

    def encode_prefix(self, rc: RenderedChat, n: int) -> EncodedChat:
        """The ids of the rendering's first n characters, encoded with the same cuts (a generation prompt's ids)."""
        spans = [(a, min(b, n)) for a, b in rc.content_spans if a < n]
        return self.encode([RenderedChat(rc.text[:n], spans, [], [], tuple(c for c in rc.cuts if c <= n))])[0]


def _marks(texts: list[str]) -> tuple[str, str] | None:
    for open_, close in _MARK_CHARS:
        if not any(open_ in t or close in t for t in texts):
            return open_, close
    return None


def _with_contents(messages: list[dict[str, Any]], contents: list[str]) -> list[dict[str, Any]]:
    return [{**m, "content": c} for m, c in zip(messages, contents, strict=True)]


def _tool_name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    name = fn.get("name")
    return name if isinstance(name, str) and name else None


def _role_known(source: str, role: str) -> bool:
    """Whether the template's source names the role at all (as a quoted string)."""
    return f"'{role}'" in source or f'"{role}"' in source


def _dropped_detail(messages: list[dict[str, str]], found: list[int], source: str) -> str:
    """Why the rendering does not hold every message once and in order, with the remedy."""
    n = len(messages)
    roles = [m["role"] for m in messages]
    missing = [i for i in range(n) if i not in found]
    repeated = sorted({i for i in found if found.count(i) > 1})
    causes: list[str] = []
    for i in missing:
        role = roles[i]
        if not _role_known(source, role):
            causes.append(
                f"message {i + 1} ({role}) was left out: the template has no `{role}` role; map the source "
                f"role that becomes `{role}` to one it renders with input.role_map (e.g. observation: "
                f"user), or give a template that renders `{role}` ({_TEMPLATE_SOURCE_HINT})"
            )
        elif role == "system":
            causes.append(
                f"message {i + 1} (system) was left out: the template writes the system prompt only in "
                "some conversations (Mistral's: inside the last message, and only when that is a user "
                "message, so never when the conversation ends with the assistant); remove the system "
                f"prompt (input.system_key) or give a template that renders it ({_TEMPLATE_SOURCE_HINT})"
            )
        else:
            causes.append(
                f"message {i + 1} ({role}) was left out although the template knows the role (it renders "
                f"`{role}` only in some positions); give a template that renders every message "
                f"({_TEMPLATE_SOURCE_HINT})"
            )
    for i in repeated:
        causes.append(
            f"message {i + 1} ({roles[i]}) was rendered {found.count(i)} times; masks need each message "
            f"once: give a template that renders it once ({_TEMPLATE_SOURCE_HINT})"
        )
    if not causes:
        moved = next(k for k, (a, b) in enumerate(zip(found, range(n), strict=False)) if a != b)
        i = found[moved]
        causes.append(
            f"message {i + 1} ({roles[i]}) was moved out of order (rendered in position {moved + 1}): the "
            "template places it elsewhere (Mistral's puts the system prompt into the last user message); "
            f"give a template that renders messages in order ({_TEMPLATE_SOURCE_HINT})"
        )
    return f"roles {roles}: " + "; ".join(causes[:3]) + (f"; and {len(causes) - 3} more" if len(causes) > 3 else "")


def _kept_edge(skeleton: str, at: int, edge: str, *, before: bool) -> str:
    """The content's leading (or trailing) whitespace if the template kept it next to the placeholder."""
    if not edge:
        return ""
    kept = skeleton[at - len(edge) : at] if before else skeleton[at : at + len(edge)]
    return edge if kept == edge else ""


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


def _template_specials(rc: RenderedChat, pattern: re.Pattern[str] | None) -> list[tuple[int, int]]:
    """Special/added tokens in the template's own text (between message contents), in order."""
    if pattern is None:
        return []
    out: list[tuple[int, int]] = []
    cursor = 0
    for s, e in [*rc.content_spans, (len(rc.text), len(rc.text))]:
        out += [m.span() for m in pattern.finditer(rc.text, cursor, s)]  # only the template text before s
        cursor = e
    return out


def _coverage(spans: list[tuple[int, int]], size: int) -> np.ndarray:
    """Prefix sums of a character indicator: chars [a, b) covered iff cum[b] - cum[a] > 0."""
    ind = np.zeros(size, dtype=np.int64)
    for a, b in spans:
        ind[a:b] = 1
    return np.concatenate([[0], np.cumsum(ind)])


def _masked(rc: RenderedChat, tokens: list[tuple[int, int, int]], split: bool = False) -> EncodedChat:
    tokens.sort(key=lambda t: (t[0], t[1]))
    arr = np.array(tokens, dtype=np.int64).reshape(-1, 3)
    starts, ends, ids = arr[:, 0], arr[:, 1], arr[:, 2]
    content = _coverage(rc.trained_content, len(rc.text))
    eot = _coverage(rc.trained_eot, len(rc.text))
    in_content = content[ends] - content[starts] > 0
    in_eot = eot[ends] - eot[starts] > 0
    types = np.where(in_content, TYPE_COMPLETION, np.where(in_eot, TYPE_EOS, TYPE_PROMPT)).astype(np.uint8)
    return EncodedChat(ids.astype(np.int32), (in_content | in_eot).astype(np.uint8), types, ends, split)
