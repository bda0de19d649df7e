"""Tool calls while streaming (pure): content passes through until a call may begin, then the
rest is held and parsed at the end, so a client sees `delta.content` for text and one
`delta.tool_calls` entry per call (id, name and the whole arguments) before `finish_reason`
"tool_calls". An OpenAI client that accumulates deltas ends with the same message as without
streaming. Held text that turns out not to be a call is sent as content at the end.

NOTE: arguments arrive in one delta per call, not token by token as vLLM sends them; clients
accumulate either the same way.
"""

from __future__ import annotations

from .protocol import ToolChoice
from .toolparsers import HermesParser, Llama3JsonParser, ParsedOutput, ToolCall, forced_calls


class ToolCallStream:
    """One choice's text deltas in; content to send now, and at `finish` the calls."""

    def __init__(self, parser: HermesParser | Llama3JsonParser, choice: ToolChoice, name: str | None = None) -> None:
        self.parser = parser
        self.choice = choice
        self.name = name
        self._text = ""  # everything so far
        self._sent = 0  # chars of _text sent as content
        self._holding = choice in (ToolChoice.REQUIRED, ToolChoice.NAMED)

    def push(self, text: str) -> str:
        """Content that can be sent now (may be empty while a call might be starting)."""
        self._text += text
        if self._holding:
            return ""
        if isinstance(self.parser, Llama3JsonParser):
            return self._push_at_start()
        marker = self.parser.start
        at = self._text.find(marker, self._sent)
        if at >= 0:
            self._holding = True
            return self._send(at)
        return self._send(len(self._text) - _partial_suffix(self._text, marker))

    def _push_at_start(self) -> str:
        if self._sent:
            return self._send(len(self._text))
        body = self._text.lstrip()
        if not body or self.parser.start.startswith(body):
            return ""
        if self.parser.starts_call(body):
            self._holding = True
            return ""
        return self._send(len(self._text))

    def _send(self, end: int) -> str:
        out, self._sent = self._text[self._sent : end], max(self._sent, end)
        return out

    def finish(self) -> tuple[str, tuple[ToolCall, ...]]:
        """(content still to send, the calls) once the output is complete."""
        parsed = self.parse(self._text)
        if parsed.tool_calls:
            return "", parsed.tool_calls
        return self._send(len(self._text)), ()

    def parse(self, text: str) -> ParsedOutput:
        if self.choice in (ToolChoice.REQUIRED, ToolChoice.NAMED):
            return forced_calls(text, self.choice, self.name)
        return self.parser.parse(text)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
