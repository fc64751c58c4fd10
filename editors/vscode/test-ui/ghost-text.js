#!/usr/bin/env node
/**
 * End to end in a real VS Code workbench: code-server (npm) with the packaged draftline.vsix installed,
 * driven by Chromium through playwright-core. Opens demo.py, triggers an inline suggestion, checks
 * that draftline's ghost text is shown (after Enter: an automatic trigger), accepts it with Tab, and
 * reads the status bar item (latency, and acceptance > 0%: the item's command reached the server).
 *
 * Env: CODE_SERVER (bin/code-server), PLAYWRIGHT_CORE (the playwright-core package dir), CHROMIUM
 * (executable), VSIX, DRAFTLINE_CMD (the `draftline` executable), OUT (JSON result file).
 * Prints one JSON line; exit 0 only when the ghost text was shown and accepted.
 */
'use strict';
const { spawn, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} not set`);
  return value;
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

async function waitHttp(url, deadline) {
  for (;;) {
    try {
      const res = await fetch(url);
      if (res.status < 500) return;
    } catch {}
    if (Date.now() > deadline) throw new Error(`code-server did not answer at ${url}`);
    await sleep(200);
  }
}

async function main() {
  const result = { steps: [] };
  const step = (s) => result.steps.push(s);
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'draftline-code-server-'));
  const userData = path.join(tmp, 'user-data');
  const extensions = path.join(tmp, 'extensions');
  const workspace = path.join(tmp, 'ws');
  fs.mkdirSync(path.join(userData, 'User'), { recursive: true });
  fs.mkdirSync(workspace);
  fs.writeFileSync(path.join(workspace, 'demo.py'), 'def add(a, b):\n    \n');
  fs.writeFileSync(
    path.join(userData, 'User', 'settings.json'),
    JSON.stringify({
      'workbench.startupEditor': 'none',
      'workbench.tips.enabled': false,
      'security.workspace.trust.enabled': false,
      'telemetry.telemetryLevel': 'off',
      'extensions.autoCheckUpdates': false,
      'extensions.autoUpdate': false,
      'editor.inlineSuggest.enabled': true,
      'editor.quickSuggestions': { other: false, comments: false, strings: false },
      'draftline.server.command': env('DRAFTLINE_CMD'),
      'draftline.model.target': 'fake',
      'draftline.completion.debounceMs': 0,
      'draftline.index.enabled': false,
      'draftline.status.pollMs': 250,
      'draftline.serverSettings': { model: { options: { text: 'return a + b' } } },
    }),
  );
  const childEnv = { ...process.env, XDG_CONFIG_HOME: path.join(tmp, 'xdg'), XDG_DATA_HOME: path.join(tmp, 'xdg-data') };
  const common = ['--user-data-dir', userData, '--extensions-dir', extensions];
  const codeServer = env('CODE_SERVER');

  const install = spawnSync(codeServer, [...common, '--install-extension', env('VSIX')], { env: childEnv, encoding: 'utf8', timeout: 60000 });
  if (install.status !== 0) throw new Error(`--install-extension failed: ${install.stdout}${install.stderr}`);
  result.installed = fs.readdirSync(extensions).filter((d) => d.startsWith('draftline.'));
  step('installed');

  const port = await freePort();
  const server = spawn(
    codeServer,
    [...common, '--auth', 'none', '--bind-addr', `127.0.0.1:${port}`, '--disable-telemetry', '--disable-workspace-trust', workspace],
    { env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let serverLog = '';
  server.stdout.on('data', (c) => (serverLog += c));
  server.stderr.on('data', (c) => (serverLog += c));
  let browser;
  let page;
  try {
    await waitHttp(`http://127.0.0.1:${port}/healthz`, Date.now() + 60000);
    step('code-server up');
    const { chromium } = require(env('PLAYWRIGHT_CORE'));
    browser = await chromium.launch({ executablePath: env('CHROMIUM'), headless: true, args: ['--no-sandbox', '--disable-gpu'] });
    page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    await page.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(workspace)}`);
    await page.waitForSelector('.monaco-workbench', { timeout: 60000 });
    step('workbench');

    // the status bar item: the extension activated, started `draftline serve`, and polled draftline/status
    const item = page.locator('.statusbar-item', { hasText: 'draftline' }).first();
    await item.waitFor({ timeout: 60000 });
    await page.waitForFunction(
      () => [...document.querySelectorAll('.statusbar-item')].some((e) => /draftline .*ms/.test(e.textContent || '')),
      null,
      { timeout: 30000 },
    );
    result.status_before = (await item.textContent()).trim();
    step('status bar ready');

    // open demo.py with Quick Open
    await page.locator('.monaco-workbench').click({ position: { x: 700, y: 400 } });
    await page.keyboard.press('Control+P');
    await page.keyboard.type('demo.py');
    await page.locator('.quick-input-list .monaco-list-row', { hasText: 'demo.py' }).first().waitFor({ timeout: 30000 });
    await page.keyboard.press('Enter');
    const editor = page.locator('.editor-instance .monaco-editor').first();
    await editor.waitFor({ timeout: 30000 });
    await page.waitForFunction(() => (document.querySelector('.editor-instance .view-lines')?.textContent || '').replace(/\u00a0/g, ' ').includes('def add'), null, { timeout: 30000 });
    step('editor');

    // end of line 1, Enter: VS Code auto-indents the new line 2 and requests an inline suggestion (automatic trigger)
    await editor.locator('.view-lines').click();
    await page.keyboard.press('Control+Home');
    await page.keyboard.press('End');
    await page.keyboard.press('Enter');
    const ghost = page.locator('.ghost-text-decoration, .ghost-text, [class*="ghost-text"]');
    try {
      await ghost.first().waitFor({ timeout: 15000 });
    } catch {
      await page.keyboard.press('Alt+Backslash'); // editor.action.inlineSuggest.trigger
      await ghost.first().waitFor({ timeout: 15000 }).catch(() => undefined);
    }
    result.ghost = ((await ghost.allTextContents()) || []).join('').replace(/\u00a0/g, ' ');
    step('ghost text');
    await page.screenshot({ path: path.join(process.env.OUT_DIR || tmp, 'ghost.png') }).catch(() => undefined);

    await page.keyboard.press('Tab');
    await page.waitForFunction(
      () => (document.querySelector('.editor-instance .view-lines')?.textContent || '').replace(/\u00a0/g, ' ').includes('return a + b'),
      null,
      { timeout: 10000 },
    ).catch(() => undefined);
    const lines = await editor.locator('.view-line').evaluateAll((els) =>
      els.sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top)).map((e) => e.textContent || ''),
    ); // DOM order is not line order
    result.lines = lines.map((l) => l.replace(/\u00a0/g, ' '));
    result.ghost_after_tab = await ghost.count();
    result.accepted = result.lines.some((l) => l === '    return a + b') && result.ghost_after_tab === 0;
    step('accepted');
    // the accept command reached the server: the status bar's acceptance goes up from 0%
    await page.waitForFunction(
      () => [...document.querySelectorAll('.statusbar-item')].some((e) => /draftline .*ms · [1-9]\d*%/.test(e.textContent || '')),
      null,
      { timeout: 15000 },
    ).catch(() => undefined);
    result.status_after = (await item.textContent()).trim();
  } catch (err) {
    result.error = String(err && err.stack ? err.stack : err);
    if (page) {
      result.statusbar = await page.locator('.statusbar-item').allTextContents().catch(() => []);
      await page.screenshot({ path: path.join(process.env.OUT_DIR || tmp, 'failure.png') }).catch(() => undefined);
    }
  } finally {
    if (browser) await browser.close().catch(() => undefined);
    server.kill('SIGTERM');
    await sleep(300);
    result.server_log_tail = serverLog.slice(-1500);
    if (!process.env.KEEP_TMP) fs.rmSync(tmp, { recursive: true, force: true });
    else result.tmp = tmp;
  }
  result.server_accepted = /· [1-9]\d*%/.test(result.status_after || '');
  const ok = !result.error && result.ghost.includes('return a + b') && result.accepted && result.server_accepted;
  result.ok = ok;
  const text = JSON.stringify(result);
  if (process.env.OUT) fs.writeFileSync(process.env.OUT, text);
  console.log(text);
  process.exit(ok ? 0 : 1);
}

main().catch((err) => {
  console.error(err);
  process.exit(2);
});
