/**
 * Helpers shared by the code-server UI scripts (ghost-text.js, notebook.js): a throwaway code-server
 * (user data, extensions dir, workspace) with the packaged draftline.vsix installed, opened in headless
 * Chromium through playwright-core, and the status bar item that says the extension talks to the server.
 *
 * Env: CODE_SERVER (bin/code-server), PLAYWRIGHT_CORE (the playwright-core package dir), CHROMIUM
 * (executable), VSIX, DRAFTLINE_CMD (the `draftline` executable), OUT (JSON result file), OUT_DIR
 * (screenshots), KEEP_TMP (keep the temporary directory).
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
/** Text as the DOM renders it: monaco draws spaces as U+00A0. */
const plain = (s) => (s || '').replace(/\u00a0/g, ' ');

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

/** Poll `check` (sync or async) until it returns a truthy value; throw `what` after `ms`. */
async function until(check, ms, what) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms: ${what}`);
    await sleep(200);
  }
}

/** User settings for a quiet workbench with draftline on the fake engine; `extra` is merged over them. */
function userSettings(extra = {}) {
  return {
    'workbench.startupEditor': 'none',
    'workbench.tips.enabled': false,
    'security.workspace.trust.enabled': false,
    'telemetry.telemetryLevel': 'off',
    'extensions.autoCheckUpdates': false,
    'extensions.autoUpdate': false,
    'extensions.ignoreRecommendations': true,
    'editor.inlineSuggest.enabled': true,
    'editor.quickSuggestions': { other: false, comments: false, strings: false },
    'draftline.server.command': env('DRAFTLINE_CMD'),
    'draftline.model.target': 'fake',
    'draftline.completion.debounceMs': 0,
    'draftline.index.enabled': false,
    'draftline.status.pollMs': 250,
    ...extra,
  };
}

/**
 * A temporary code-server with the .vsix installed and `files` ({relative path: text}) in its workspace,
 * opened in Chromium. Returns { page, workspace, result, step, close }; `close()` stops both and fills
 * result.server_log_tail (call it in a finally).
 */
async function openWorkbench({ files, settings, result }) {
  const step = (s) => result.steps.push(s);
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'draftline-code-server-'));
  const userData = path.join(tmp, 'user-data');
  const extensions = path.join(tmp, 'extensions');
  const workspace = path.join(tmp, 'ws');
  fs.mkdirSync(path.join(userData, 'User'), { recursive: true });
  fs.mkdirSync(workspace);
  for (const [name, text] of Object.entries(files)) fs.writeFileSync(path.join(workspace, name), text);
  fs.writeFileSync(path.join(userData, 'User', 'settings.json'), JSON.stringify(userSettings(settings)));
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
  const close = async () => {
    if (browser) await browser.close().catch(() => undefined);
    server.kill('SIGTERM');
    await sleep(300);
    result.server_log_tail = serverLog.slice(-1500);
    if (!process.env.KEEP_TMP) fs.rmSync(tmp, { recursive: true, force: true });
    else result.tmp = tmp;
  };
  try {
    await waitHttp(`http://127.0.0.1:${port}/healthz`, Date.now() + 60000);
    step('code-server up');
    const { chromium } = require(env('PLAYWRIGHT_CORE'));
    browser = await chromium.launch({ executablePath: env('CHROMIUM'), headless: true, args: ['--no-sandbox', '--disable-gpu'] });
    page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    await page.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(workspace)}`);
    await page.waitForSelector('.monaco-workbench', { timeout: 60000 });
    step('workbench');
  } catch (err) {
    await close();
    throw err;
  }
  return { page, workspace, step, close };
}

/** The draftline status bar item, once it shows a latency (the extension started the server and polled it). */
async function statusItem(page, result) {
  const item = page.locator('.statusbar-item', { hasText: 'draftline' }).first();
  await item.waitFor({ timeout: 60000 });
  await page.waitForFunction(
    () => [...document.querySelectorAll('.statusbar-item')].some((e) => /draftline .*ms/.test(e.textContent || '')),
    null,
    { timeout: 30000 },
  );
  result.status_before = (await item.textContent()).trim();
  result.steps.push('status bar ready');
  return item;
}

/** Open a workspace file with Quick Open (Ctrl+P). */
async function quickOpen(page, name) {
  await page.locator('.monaco-workbench').click({ position: { x: 700, y: 400 } });
  await page.keyboard.press('Control+P');
  await page.keyboard.type(name);
  await page.locator('.quick-input-list .monaco-list-row', { hasText: name }).first().waitFor({ timeout: 30000 });
  await page.keyboard.press('Enter');
}

/** The ghost text decorations inline suggestions render (within `scope`, a page or locator). */
const ghostLocator = (scope) => scope.locator('.ghost-text-decoration, .ghost-text, [class*="ghost-text"]');

/** An editor's rendered lines in line order (the DOM order of .view-line is not line order). */
async function viewLines(editor) {
  const lines = await editor.locator('.view-line').evaluateAll((els) =>
    els.sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top)).map((e) => e.textContent || ''),
  );
  return lines.map(plain);
}

/** The acceptance rate in the status bar went above 0%: the accept command reached the server. */
async function waitAccepted(page, item, result) {
  await page.waitForFunction(
    () => [...document.querySelectorAll('.statusbar-item')].some((e) => /draftline .*ms · [1-9]\d*%/.test(e.textContent || '')),
    null,
    { timeout: 15000 },
  ).catch(() => undefined);
  result.status_after = (await item.textContent()).trim();
  result.server_accepted = /· [1-9]\d*%/.test(result.status_after || '');
}

async function screenshot(page, name) {
  if (page) await page.screenshot({ path: path.join(process.env.OUT_DIR || os.tmpdir(), name) }).catch(() => undefined);
}

/** Record the failure (stack, status bar, a screenshot). */
async function recordError(result, err, page) {
  result.error = String(err && err.stack ? err.stack : err);
  if (page) {
    result.statusbar = await page.locator('.statusbar-item').allTextContents().catch(() => []);
    await screenshot(page, 'failure.png');
  }
}

/** Write the result to OUT, print it as one JSON line, exit 0 when ok. */
function finish(result, ok) {
  result.ok = Boolean(ok);
  const text = JSON.stringify(result);
  if (process.env.OUT) fs.writeFileSync(process.env.OUT, text);
  console.log(text);
  process.exit(ok ? 0 : 1);
}

function run(main) {
  main().catch((err) => {
    console.error(err);
    process.exit(2);
  });
}

module.exports = {
  env, sleep, plain, until, freePort, waitHttp, userSettings, openWorkbench, statusItem, quickOpen, ghostLocator,
  viewLines, waitAccepted, screenshot, recordError, finish, run,
};
