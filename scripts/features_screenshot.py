"""Screenshot of the app's Features tab with "Why this word" on the shipped de->en model (docs/screenshots/).

    python scripts/features_screenshot.py [SENTENCE OUTPUT_INDEX OUT.png]

Defaults: "Zwei Hunde spielen im Schnee.", output token 1, docs/screenshots/screenshot_features_1500.png.

Serves apps/attention.py on a free port with the shipped checkpoints, translates the sentence, opens the Features
tab, picks the output token (an index), opens its top feature's dashboard and saves a full-page screenshot 1500 px
wide; exits non-zero when the page logged a console error.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120_000


def main(sentence: str, output: int, path: Path) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "panel", "serve", "apps/attention.py", "--port", str(port),
                               "--setup", "apps/serve_setup.py", "--address", "127.0.0.1",
                               f"--allow-websocket-origin=127.0.0.1:{port}"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/attention"
        for _ in range(120):
            try:
                urllib.request.urlopen(url, timeout=30)
                break
            except OSError:
                time.sleep(1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium")
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(url + "?ckpt=multi30k-de-en&site=hook_memory")
            page.locator(".translation").get_by_text("log p").wait_for(timeout=TIMEOUT)
            page.locator(".sentence-input textarea").fill(sentence)
            page.locator(".translate-btn button").click()
            page.locator(".translation").get_by_text("ms").wait_for(timeout=TIMEOUT)
            page.locator(".main-tabs").get_by_text("Features", exact=True).click()
            picker = page.locator(".features-output select")
            picker.wait_for(timeout=TIMEOUT)
            picker.select_option(label=picker.locator("option").nth(output).inner_text())
            page.locator(".features-why").get_by_text(f"output token {output},").wait_for(timeout=TIMEOUT)
            page.locator(".features-why-link button").first.click()
            page.locator(".features-why-link .bk-btn-primary").first.wait_for(timeout=TIMEOUT)
            page.wait_for_timeout(3000)  # the dashboard's figures painted
            page.screenshot(path=str(path), full_page=True)
            browser.close()
    finally:
        server.terminate()
        server.wait()
    print(f"wrote {path}; console errors: {errors}")
    return 1 if errors else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(args[0] if args else "Zwei Hunde spielen im Schnee.", int(args[1]) if len(args) > 1 else 1,
                  Path(args[2]) if len(args) > 2 else ROOT / "docs" / "screenshots" / "screenshot_features_1500.png"))
