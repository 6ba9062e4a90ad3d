"""A real IPython kernel driven as a notebook frontend drives it: execute requests in, iopub
messages (stream, display_data, update_display_data, execute_result, error) and the reply out."""
from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from jupyter_client import KernelManager


@dataclass
class Execution:
    messages: list[dict] = field(default_factory=list)  # iopub messages of this request, in order
    reply: dict | None = None
    msg_id: str | None = None

    def of_type(self, *types: str) -> list[dict]:
        return [m for m in self.messages if m["msg_type"] in types]

    def stream(self, name: str = "stdout") -> str:
        return "".join(m["content"]["text"] for m in self.of_type("stream") if m["content"]["name"] == name)

    @property
    def status(self) -> str:
        return self.reply["content"]["status"]

    @property
    def error_name(self) -> str | None:
        return self.reply["content"].get("ename")

    @property
    def result(self) -> str | None:
        results = self.of_type("execute_result")
        return results[-1]["content"]["data"]["text/plain"] if results else None

    def displays(self, mime: str) -> list[dict]:
        """display_data and update_display_data messages whose data has `mime`."""
        return [m for m in self.of_type("display_data", "update_display_data") if mime in m["content"]["data"]]


class Kernel:
    def __init__(self, env: dict, cwd: Path) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(env=env, cwd=str(cwd))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)
        # iopub messages that arrived while another cell was awaited, by their cell's msg_id (a
        # background run's view keeps updating the cell that started it)
        self.late: dict[str, list[dict]] = {}

    def execute(self, code: str, *, timeout: float = 180.0,
                on_message: Callable[[dict], None] | None = None) -> Execution:
        """Run a cell; on_message sees each of its iopub messages as it arrives."""
        msg_id = self.client.execute(code)
        run = Execution(msg_id=msg_id)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._next(self.client.get_iopub_msg, deadline, code)
            if msg["parent_header"].get("msg_id") != msg_id:
                self.late.setdefault(msg["parent_header"].get("msg_id"), []).append(msg)
                continue
            run.messages.append(msg)
            if on_message is not None:
                on_message(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        while run.reply is None:
            msg = self._next(self.client.get_shell_msg, deadline, code)
            if msg["parent_header"].get("msg_id") == msg_id:
                run.reply = msg
        return run

    def ok(self, code: str, **kwargs) -> Execution:
        run = self.execute(code, **kwargs)
        assert run.status == "ok", f"cell failed: {run.reply['content']}\n{run.stream('stderr')}"
        return run

    def value(self, expression: str):
        """The value of a Python literal expression evaluated in the kernel."""
        import ast

        return ast.literal_eval(self.ok(expression).result)

    def drain(self, seconds: float) -> None:
        """Take the iopub messages that arrive within `seconds` (no cell running) into `late`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self.client.get_iopub_msg(timeout=left)
            except queue.Empty:
                return
            self.late.setdefault(msg["parent_header"].get("msg_id"), []).append(msg)

    def reply_waiting(self) -> bool:
        return self.client.shell_channel.msg_ready()

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)

    @staticmethod
    def _next(get, deadline: float, code: str) -> dict:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"the kernel did not finish this cell in time:\n{code}")
        try:
            return get(timeout=remaining)
        except queue.Empty:
            raise TimeoutError(f"the kernel did not finish this cell in time:\n{code}") from None
