"""A user of the hub as a browser is one, without the browser: log in through the Hub's login
form, start the server, and run code in a kernel of it over the kernel's websocket."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

import requests
import websocket


@dataclass
class Ran:
    stdout: str
    error: str | None  # "Name: value" of an error, None when the cell succeeded
    outputs: list[dict] = field(default_factory=list)


class HubUser:
    def __init__(self, url: str, name: str, password: str) -> None:
        self.url, self.name, self.password = url.rstrip("/"), name, password
        self.http = requests.Session()
        self.token: str | None = None
        self.kernel_id: str | None = None

    def login(self) -> requests.Response:
        self.http.get(f"{self.url}/hub/login", timeout=30)
        return self.http.post(f"{self.url}/hub/login?next=", timeout=60, allow_redirects=False, data={
            "username": self.name, "password": self.password, "_xsrf": self.http.cookies.get("_xsrf", "")})

    def start_server(self, timeout_s: float = 300.0) -> None:
        """Log in and make an API token (once: a second login would hold two _xsrf cookies), start
        the server and wait until it answers."""
        if self.token is None:
            self.token = self._log_in_for_a_token()
        self.hub_api("POST", f"users/{self.name}/server")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            model = self.hub_api("GET", f"users/{self.name}").json()
            if model.get("server"):
                if self.api("GET", "api/status").status_code == 200:
                    return
            elif not model.get("pending"):  # refused while a stop was pending (the culler's): ask again
                self.hub_api("POST", f"users/{self.name}/server")
            time.sleep(1)
        raise TimeoutError(f"the server of {self.name} did not start within {timeout_s:.0f} s")

    def _log_in_for_a_token(self) -> str:
        answer = self.login()
        assert answer.status_code == 302, f"{self.name} could not log in: {answer.status_code} {answer.text[-300:]}"
        made = self.http.post(f"{self.url}/hub/api/users/{self.name}/tokens", json={"note": "tests"}, timeout=30,
                              headers={"X-XSRFToken": self.http.cookies.get("_xsrf", "")})
        made.raise_for_status()
        return made.json()["token"]

    def hub_api(self, method: str, path: str, **kwargs) -> requests.Response:
        return requests.request(method, f"{self.url}/hub/api/{path}", timeout=60,
                                headers={"Authorization": f"token {self.token}"}, **kwargs)

    def server_path(self, user: str | None = None) -> str:
        """Where a user server (this user's by default) is under the Hub's URL."""
        return f"/user/{user or self.name}"

    def api(self, method: str, path: str, user: str | None = None, **kwargs) -> requests.Response:
        """A request to a user server (this user's by default) with this user's token."""
        return requests.request(method, f"{self.url}{self.server_path(user)}/{path}", timeout=60,
                                allow_redirects=False, headers={"Authorization": f"token {self.token}"}, **kwargs)

    def restart_kernel(self) -> None:
        """Restart this user's kernel through the Jupyter API, as the notebook's Restart does."""
        self.api("POST", f"api/kernels/{self.kernel_id}/restart").raise_for_status()

    def shut_down_kernel(self) -> None:
        """Shut this user's kernel down through the Jupyter API; the next run() starts a new one."""
        self.api("DELETE", f"api/kernels/{self.kernel_id}").raise_for_status()
        self.kernel_id = None

    def server_running(self) -> bool:
        """Whether the Hub lists this user's server as running (asks the Hub, not the server)."""
        return bool(self.hub_api("GET", f"users/{self.name}").json().get("server"))

    def server_stopped(self) -> bool:
        """Whether the Hub lists this user's server as stopped, no stop pending (asks the Hub)."""
        model = self.hub_api("GET", f"users/{self.name}").json()
        return not model.get("server") and not model.get("pending")

    def run(self, code: str, timeout_s: float = 300.0) -> Ran:
        """Execute `code` in this user's kernel (started at the first call) and collect its output."""
        if self.kernel_id is None:
            started = self.api("POST", "api/kernels", json={"name": "python3"})
            started.raise_for_status()
            self.kernel_id = started.json()["id"]
        ws_url = self.url.replace("http", "ws", 1) + f"{self.server_path()}/api/kernels/{self.kernel_id}/channels"
        ws = websocket.create_connection(ws_url, header=[f"Authorization: token {self.token}"], timeout=timeout_s)
        try:
            msg_id = uuid.uuid4().hex
            ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": self.name,
                                           "session": uuid.uuid4().hex, "version": "5.3"},
                                "parent_header": {}, "metadata": {}, "channel": "shell",
                                "content": {"code": code, "silent": False, "store_history": False,
                                            "user_expressions": {}, "allow_stdin": False}}))
            return _collect(ws, msg_id, time.monotonic() + timeout_s)
        finally:
            ws.close()


def _collect(ws, msg_id: str, deadline: float) -> Ran:
    stdout, error, outputs = [], None, []
    while time.monotonic() < deadline:
        message = json.loads(ws.recv())
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "stream":
            stdout.append(content["text"])
        elif kind == "error":
            error = f"{content['ename']}: {content['evalue']}"
        elif kind in ("display_data", "execute_result", "update_display_data"):
            outputs.append(content.get("data", {}))
        elif kind == "status" and content["execution_state"] == "idle":
            return Ran("".join(stdout), error, outputs)
    raise TimeoutError("the cell did not finish in time")
