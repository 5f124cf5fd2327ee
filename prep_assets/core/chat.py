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

Tools are passed to the template (`tools=`) where the record has them. Templates render in transformers'
sandboxed Jinja environment; no custom code runs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from prep_assets.core.errors import TokenizerError
from prep_assets.core.records import TYPE_COMPLETION, TYPE_EOS, TYPE_PROMPT, Invalid
from prep_assets.core.tokenizer import PinnedTokenizer

_MARK_CHARS = (("\ue000", "\ue001"), ("\U000f0000", "\U000f0001"), ("\U00100000", "\U00100001"))


@dataclass(frozen=True)
class RenderedChat:
    """A rendering with the character spans that train, split into content (type 1) and end-of-turn (type 3)."""

    text: str
    content_spans: list[tuple[int, int]]  # every message's characters (trained or not): not template text
    trained_content: list[tuple[int, int]]
    trained_eot: list[tuple[int, int]]


@dataclass(frozen=True)
class EncodedChat:
    token_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8
    token_type_ids: np.ndarray  # uint8
    char_ends: np.ndarray  # int64: the character (of the rendering) each token ends at


class ChatTemplate:
    """The pinned tokenizer's chat template (or the spec's), rendered through transformers."""

    def __init__(self, pt: PinnedTokenizer, template: str | None = None) -> None:
        self.pt = pt
        self.template = template
        if template is None and not getattr(pt.hf, "chat_template", None):
            raise TokenizerError(
                "the tokenizer has no chat template; give tokenizer.chat_template (inline Jinja) or "
                "tokenizer.chat_template_file (e.g. a ChatML template) in the dataset spec"
            )
        added = sorted(pt.hf.backend_tokenizer.get_added_tokens_decoder().items())
        self.added_ids = {tok.content: int(i) for i, tok in added}
        contents = sorted(self.added_ids, key=lambda c: (-len(c), c))
        self._added_re = re.compile("|".join(map(re.escape, contents))) if contents else None

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               *, add_generation_prompt: bool = False) -> str:
        out = self.pt.hf.apply_chat_template(
            messages, tools=tools, chat_template=self.template, add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
        assert isinstance(out, str)
        return out

    def _try_render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str | Invalid:
        try:
            return self.render(messages, tools)
        except Exception as exc:  # Jinja raises TemplateError, raise_exception() and type errors alike
            return Invalid("chat_template_error", f"the chat template cannot render this conversation: {exc}")

    def spans(self, messages: list[dict[str, str]], trained: list[bool],
              tools: list[dict[str, Any]] | None = None) -> RenderedChat | Invalid:
        """Render the conversation and locate every message, and the trained turns with their end of turn."""
        if tools and self._added_re is not None:
            hit = self._added_re.search(json.dumps(tools, ensure_ascii=False))
            if hit:  # the template writes tools as its own text: a special string there would become a token
                return Invalid("special_token_in_tools", f"the tool definitions contain the special-token string "
                               f"{hit.group()!r}, which the template would emit as a real special token")
        texts = [m["content"] for m in messages]
        marks = _marks(texts)
        if marks is None:
            return Invalid("chat_template_mismatch", "content holds every placeholder character we could use")
        open_, close = marks
        cores = [t.strip() for t in texts]
        leads = [t[: len(t) - len(t.lstrip())] for t in texts]
        trails = [t[len(t.rstrip()):] if t.strip() else "" for t in texts]  # whitespace-only: all of it is lead
        holders = [f"{lead}{open_}{i}{close}{trail}" for i, (lead, trail) in enumerate(zip(leads, trails))]
        skeleton = self._try_render(_with_contents(messages, holders), tools)
        if isinstance(skeleton, Invalid):
            return skeleton
        found = list(re.finditer(re.escape(open_) + r"(\d+)" + re.escape(close), skeleton))
        if [int(m.group(1)) for m in found] != list(range(len(messages))):
            return Invalid("chat_template_dropped_message",
                           f"the template rendered messages {[int(m.group(1)) + 1 for m in found]} of "
                           f"{len(messages)} (roles {[m['role'] for m in messages]}); map unsupported roles "
                           "with input.role_map or use a template that renders them")
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
            between = skeleton[cursor: m.start() - len(lead)]
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
            return Invalid("chat_template_mismatch",
                           "the template changes message content in a way its characters cannot be located")
        trained_content: list[tuple[int, int]] = []
        trained_eot: list[tuple[int, int]] = []
        for i in (i for i, t in enumerate(trained) if t):
            partial = self._try_render(_with_contents(messages[: i + 1], holders[: i + 1]), tools)
            if isinstance(partial, Invalid):
                return partial
            mark = f"{open_}{i}{close}"
            at = partial.rfind(mark)
            after = partial[at + len(mark):] if at >= 0 else ""
            eot = _common_prefix(after, skeleton[found[i].end():])
            eot = eot[mark_ends[i] - found[i].end():].rstrip()  # past the content's own trailing whitespace
            trained_content.append((self._turn_start(messages, i, tools, real, spans, core_starts), spans[i][1]))
            if eot:
                trained_eot.append((spans[i][1], spans[i][1] + len(eot)))
        return RenderedChat(text, spans, trained_content, trained_eot)

    def _turn_start(self, messages: list[dict[str, Any]], i: int, tools: list[dict[str, Any]] | None, real: str,
                    spans: list[tuple[int, int]], core_starts: list[int]) -> int:
        """Where an assistant turn's trained characters start: right after the generation prompt.

        Whitespace the template writes between the generation prompt and the content (Mistral's space
        before the answer) is generated by the model at inference, so it trains; whitespace that is part of
        the generation prompt (a header's blank line before a trimmed content) stays masked. Anything else
        (a template without a generation prompt, or whose history rendered for generation is not a prefix
        of the conversation: README, Mistral with tools) falls back to the content's own start.
        """
        if messages[i]["role"] != "assistant" or i == 0:
            return spans[i][0]
        try:
            prompt = self.render(messages[:i], tools, add_generation_prompt=True)
        except Exception:  # a template may refuse a history that ends here; the content offsets stand
            return spans[i][0]
        if (real.startswith(prompt) and spans[i - 1][1] <= len(prompt) <= core_starts[i]
                and not real[len(prompt): core_starts[i]].strip()):
            return len(prompt)
        return spans[i][0]

    def encode(self, rendered: list[RenderedChat]) -> list[EncodedChat]:
        """Token ids, loss masks and token types of renderings, encoded in one batch (two when input starts encode
        differently from continuations)."""
        pieces: list[tuple[int, int, int]] = []  # (record, start, end) of text pieces
        specials: list[list[tuple[int, int, int]]] = [[] for _ in rendered]  # (start, end, id)
        for r, rc in enumerate(rendered):
            cursor = 0
            for s, e in _template_specials(rc, self._added_re):
                if s > cursor:
                    pieces.append((r, cursor, s))
                specials[r].append((s, e, self.added_ids[rc.text[s:e]]))
                cursor = e
            if cursor < len(rc.text):
                pieces.append((r, cursor, len(rc.text)))
        if self.pt.continuation is self.pt.encoder:  # starts encode like continuations: one call
            groups = [(list(range(len(pieces))), self.pt.encoder)]
        else:
            groups = [([i for i, p in enumerate(pieces) if p[1] == 0], self.pt.encoder),
                      ([i for i, p in enumerate(pieces) if p[1] != 0], self.pt.continuation)]
        encodings: list[Any] = [None] * len(pieces)
        for group, encoder in groups:
            texts = [rendered[pieces[i][0]].text[pieces[i][1]: pieces[i][2]] for i in group]
            for i, enc in zip(group, encoder.encode_batch(texts, add_special_tokens=False), strict=True):
                encodings[i] = enc
        per_record: list[list[tuple[int, int, int]]] = [list(s) for s in specials]
        for (r, start, _), enc in zip(pieces, encodings, strict=True):
            per_record[r].extend((start + a, start + b, t) for t, (a, b) in zip(enc.ids, enc.offsets, strict=True))
        return [_masked(rc, toks) for rc, toks in zip(rendered, per_record, strict=True)]


def _marks(texts: list[str]) -> tuple[str, str] | None:
    for open_, close in _MARK_CHARS:
        if not any(open_ in t or close in t for t in texts):
            return open_, close
    return None


def _with_contents(messages: list[dict[str, Any]], contents: list[str]) -> list[dict[str, Any]]:
    return [{**m, "content": c} for m, c in zip(messages, contents, strict=True)]


def _kept_edge(skeleton: str, at: int, edge: str, *, before: bool) -> str:
    """The content's leading (or trailing) whitespace if the template kept it next to the placeholder."""
    if not edge:
        return ""
    kept = skeleton[at - len(edge): at] if before else skeleton[at: at + len(edge)]
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


def _masked(rc: RenderedChat, tokens: list[tuple[int, int, int]]) -> EncodedChat:
    tokens.sort(key=lambda t: (t[0], t[1]))
    arr = np.array(tokens, dtype=np.int64).reshape(-1, 3)
    starts, ends, ids = arr[:, 0], arr[:, 1], arr[:, 2]
    content = _coverage(rc.trained_content, len(rc.text))
    eot = _coverage(rc.trained_eot, len(rc.text))
    in_content = content[ends] - content[starts] > 0
    in_eot = eot[ends] - eot[starts] > 0
    types = np.where(in_content, TYPE_COMPLETION, np.where(in_eot, TYPE_EOS, TYPE_PROMPT)).astype(np.uint8)
    return EncodedChat(ids.astype(np.int32), (in_content | in_eot).astype(np.uint8), types, ends)
