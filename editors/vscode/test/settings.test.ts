/** The settings -> server options mapping, checked alone, against package.json, and against the server's config.py. */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, test } from 'node:test';
import {
  DEFAULTS,
  MAX_POLL_MS,
  MIN_POLL_MS,
  SETTING_KEYS,
  Settings,
  clientConfig,
  didChangeConfigurationParams,
  documentSelector,
  enabledFor,
  needsRestart,
  readSettings,
  serverLaunch,
  toServerOptions,
} from '../src/settings';
import { EXTENSION_DIR, python, serverEnv } from './harness';

/** Settings as VS Code's `getConfiguration('draftline').get` would return them for these user values. */
function settings(user: Record<string, unknown> = {}): Settings {
  return readSettings((key) => (key in user ? user[key] : (DEFAULTS as Record<string, unknown>)[key]));
}

const packageJson = JSON.parse(fs.readFileSync(path.join(EXTENSION_DIR, 'package.json'), 'utf8'));

describe('package.json', () => {
  test('contributes exactly the settings the extension reads, with the same defaults', () => {
    const props = packageJson.contributes.configuration.properties as Record<string, { default: unknown }>;
    assert.deepEqual(Object.keys(props).sort(), SETTING_KEYS.map((k) => `draftline.${k}`).sort());
    for (const key of SETTING_KEYS) assert.deepEqual(props[`draftline.${key}`].default, DEFAULTS[key], key);
  });

  test("status.pollMs's schema bounds are the ones readSettings clamps to", () => {
    const poll = packageJson.contributes.configuration.properties['draftline.status.pollMs'];
    assert.equal(poll.minimum, MIN_POLL_MS);
    assert.equal(poll.maximum, MAX_POLL_MS);
  });

  test('contributes the toggle, status and restart commands', () => {
    const commands = packageJson.contributes.commands.map((c: { command: string }) => c.command).sort();
    assert.deepEqual(commands, ['draftline.restart', 'draftline.showStatus', 'draftline.toggle']);
  });

  test('uses vscode-languageclient >= 10 (inline completion is a built-in feature there)', () => {
    const range: string = packageJson.dependencies['vscode-languageclient'];
    assert.match(range, /^[\^~]?(1\d|[2-9]\d)\./);
  });
});

describe('toServerOptions', () => {
  test('defaults send nothing, so the server defaults and its TOML files decide', () => {
    assert.deepEqual(toServerOptions(settings()), { draftline: {} });
  });

  test('every dedicated setting lands on its config.py field', () => {
    const options = toServerOptions(
      settings({
        'model.target': '/models/target',
        'model.draft': '/models/draft',
        'model.options': { dtype: 'float32' },
        'completion.mode': 'multi',
        'completion.debounceMs': 40,
        'completion.maxTokens': 64,
        'completion.maxLinesMulti': 8,
        'index.enabled': false,
      }),
    );
    assert.deepEqual(options, {
      draftline: {
        model: { target: '/models/target', draft: '/models/draft', options: { dtype: 'float32' } },
        completion: { mode: 'multi', debounce_ms: 40, max_tokens: 64, max_lines_multi: 8 },
        index: { enabled: false },
      },
    });
  });

  test('serverSettings passes any other option through; dedicated settings win', () => {
    const options = toServerOptions(
      settings({
        'model.target': 'fake',
        'completion.debounceMs': 0,
        serverSettings: { model: { target: 'ignored', options: { text: 'x' } }, completion: { suffix_chars: 800, debounce_ms: 99 } },
      }),
    );
    assert.deepEqual(options, {
      draftline: { model: { target: 'fake', options: { text: 'x' } }, completion: { suffix_chars: 800, debounce_ms: 0 } },
    });
  });

  test('invalid or unset values are not sent', () => {
    const options = toServerOptions(
      settings({
        'model.target': '   ',
        'completion.mode': 'fast',
        'completion.debounceMs': -1,
        'completion.maxTokens': 1.5,
        'completion.maxLinesMulti': 0,
        'index.enabled': 'yes',
        'model.options': {},
      }),
    );
    assert.deepEqual(options, { draftline: {} });
  });

  test("VS Code's settings objects are Proxies: they are copied, not structuredClone'd", () => {
    const proxied = (o: Record<string, unknown>) => new Proxy(o, {}); // what getConfiguration().get() returns
    const s = settings({
      'model.target': 'fake',
      'model.options': proxied({ dtype: 'float32' }),
      serverSettings: proxied({ model: proxied({ draft: 'x' }), completion: { suffix_chars: 800 } }),
    });
    assert.deepEqual(toServerOptions(s), {
      draftline: { model: { draft: 'x', target: 'fake', options: { dtype: 'float32' } }, completion: { suffix_chars: 800 } },
    });
  });

  test('ill-typed settings fall back to their defaults when read', () => {
    const s = settings({ 'server.args': 'serve', enable: 'no', languages: ['python'], 'status.pollMs': '5' });
    assert.deepEqual(s['server.args'], ['serve']);
    assert.equal(s.enable, true);
    assert.deepEqual(s.languages, DEFAULTS.languages);
    assert.equal(s['status.pollMs'], 2000);
  });

  test('status.pollMs is clamped to 250 ms (the schema minimum only warns)', () => {
    assert.equal(settings({ 'status.pollMs': 0 })['status.pollMs'], 250);
    assert.equal(settings({ 'status.pollMs': -5 })['status.pollMs'], 250);
    assert.equal(settings({ 'status.pollMs': 250 })['status.pollMs'], 250);
    assert.equal(settings({ 'status.pollMs': 5000 })['status.pollMs'], 5000);
  });

  test("status.pollMs is clamped to 2^31-1 ms (setInterval's largest delay: a larger one runs every 1 ms)", async () => {
    const max = 2 ** 31 - 1;
    assert.equal(MAX_POLL_MS, max);
    assert.equal(settings({ 'status.pollMs': 3_000_000_000 })['status.pollMs'], max);
    assert.equal(settings({ 'status.pollMs': 2 ** 31 })['status.pollMs'], max);
    assert.equal(settings({ 'status.pollMs': Number.MAX_SAFE_INTEGER })['status.pollMs'], max);
    assert.equal(settings({ 'status.pollMs': max })['status.pollMs'], max);
    assert.equal(settings({ 'status.pollMs': Infinity })['status.pollMs'], 2000);
    // what the status bar does with it (extension.ts): a huge setting must not poll in a tight loop
    let polls = 0;
    const timer = setInterval(() => polls++, settings({ 'status.pollMs': 3_000_000_000 })['status.pollMs']);
    await new Promise((resolve) => setTimeout(resolve, 50));
    clearInterval(timer);
    assert.equal(polls, 0);
  });

  test('the server resolves the mapped options to exactly these values, with no unknown keys', (t) => {
    const py = python();
    if (!py) return t.skip('no Python with lsp_server (set DRAFTLINE_PY)');
    const options = toServerOptions(
      settings({
        'model.target': 'fake',
        'model.draft': 'd',
        'completion.mode': 'single',
        'completion.debounceMs': 5,
        'completion.maxTokens': 7,
        'completion.maxLinesMulti': 3,
        'index.enabled': false,
        serverSettings: { model: { options: { text: 'hi' } } },
      }),
    );
    const script = [
      'import dataclasses, json, logging, sys',
      'from pathlib import Path',
      'from lsp_server.config import resolve_config',
      'logging.basicConfig(level=logging.WARNING, stream=sys.stderr)',
      'cfg = resolve_config(user_file=Path("/nonexistent/draftline.toml"), init_options=json.load(sys.stdin))',
      'print(json.dumps(dataclasses.asdict(cfg)))',
    ].join('\n');
    const run = spawnSync(py, ['-c', script], { input: JSON.stringify(options), env: serverEnv(), encoding: 'utf8' });
    assert.equal(run.status, 0, run.stderr);
    assert.equal(run.stderr.trim(), '', 'config.py warned about the mapped options');
    const cfg = JSON.parse(run.stdout);
    assert.equal(cfg.model.target, 'fake');
    assert.equal(cfg.model.draft, 'd');
    assert.deepEqual(cfg.model.options, { text: 'hi' });
    assert.equal(cfg.completion.mode, 'single');
    assert.equal(cfg.completion.debounce_ms, 5);
    assert.equal(cfg.completion.max_tokens, 7);
    assert.equal(cfg.completion.max_lines_multi, 3);
    assert.equal(cfg.index.enabled, false);
  });
});

describe('languages', () => {
  test('enable per language, "*" for the rest, and the global switch', () => {
    const s = settings({ languages: { '*': true, markdown: false } });
    assert.equal(enabledFor(s, 'python'), true);
    assert.equal(enabledFor(s, 'markdown'), false);
    assert.equal(enabledFor(settings({ enable: false }), 'python'), false);
    const only = settings({ languages: { '*': false, python: true, rust: true, go: false } });
    assert.equal(enabledFor(only, 'python'), true);
    assert.equal(enabledFor(only, 'typescript'), false);
  });

  test('the server sees every file unless "*" is off, then only the enabled languages', () => {
    assert.deepEqual(documentSelector(settings()), [
      { scheme: 'file' },
      { scheme: 'untitled' },
      { scheme: 'vscode-notebook-cell' },
    ]);
    const only = settings({ languages: { '*': false, rust: true, python: true, go: false } });
    assert.deepEqual(documentSelector(only), [
      { scheme: 'file', language: 'python' },
      { scheme: 'file', language: 'rust' },
      { scheme: 'untitled', language: 'python' },
      { scheme: 'untitled', language: 'rust' },
      { scheme: 'vscode-notebook-cell', language: 'python' },
      { scheme: 'vscode-notebook-cell', language: 'rust' },
    ]);
  });
});

describe('needsRestart', () => {
  const base = settings({ 'model.target': 'fake', 'completion.debounceMs': 10 });

  test('a changed value travels by didChangeConfiguration', () => {
    assert.equal(needsRestart(base, settings({ 'model.target': 'other', 'completion.debounceMs': 30 })), false);
    assert.equal(needsRestart(base, settings({ 'model.target': 'fake', 'completion.debounceMs': 10, enable: false })), false);
  });

  test('another server command, args, env or document set restarts', () => {
    const same = { 'model.target': 'fake', 'completion.debounceMs': 10 };
    assert.equal(needsRestart(base, settings({ ...same, 'server.command': '/venv/bin/draftline' })), true);
    assert.equal(needsRestart(base, settings({ ...same, 'server.args': ['serve', '-v'] })), true);
    assert.equal(needsRestart(base, settings({ ...same, 'server.env': { A: '1' } })), true);
    assert.equal(needsRestart(base, settings({ ...same, languages: { '*': false, python: true } })), true);
  });

  test('unsetting an option that initializationOptions carried restarts (that layer would keep it)', () => {
    assert.equal(needsRestart(base, settings({ 'model.target': 'fake' })), true);
  });
});

describe('what the extension hands vscode-languageclient', () => {
  test('ServerOptions: `draftline serve` by default, server.env over the editor environment', () => {
    assert.deepEqual(serverLaunch(settings(), { PATH: '/bin', A: 'base' }), {
      command: 'draftline',
      args: ['serve'],
      env: { PATH: '/bin', A: 'base' },
    });
    const custom = settings({ 'server.command': '/venv/bin/draftline', 'server.args': ['serve', '-v'], 'server.env': { A: 'mine' } });
    assert.deepEqual(serverLaunch(custom, { PATH: '/bin', A: 'base' }), {
      command: '/venv/bin/draftline',
      args: ['serve', '-v'],
      env: { PATH: '/bin', A: 'mine' },
    });
  });

  test('server.command: ~, ${userHome}, ${workspaceFolder} and relative paths resolved; no cwd (sys.path shadowing)', () => {
    const place = { home: '/home/me', workspaceFolder: '/ws/proj' };
    const launch = (user: Record<string, unknown>) => serverLaunch(settings(user), {}, place);
    assert.equal(launch({ 'server.command': '~/venv/bin/draftline' }).command, '/home/me/venv/bin/draftline');
    assert.equal(launch({ 'server.command': '${userHome}/venv/bin/draftline' }).command, '/home/me/venv/bin/draftline');
    assert.equal(launch({ 'server.command': '${workspaceFolder}/.venv/bin/draftline' }).command, '/ws/proj/.venv/bin/draftline');
    assert.equal(launch({ 'server.command': '.venv/bin/draftline' }).command, '/ws/proj/.venv/bin/draftline');
    assert.equal(launch({ 'server.command': './bin/draftline' }).command, '/ws/proj/bin/draftline');
    assert.equal(launch({ 'server.command': '/opt/dl/bin/draftline' }).command, '/opt/dl/bin/draftline');
    assert.equal(launch({ 'server.command': 'draftline' }).command, 'draftline'); // a PATH lookup, as before
    assert.equal(launch({ 'server.command': '/opt/My Tools/draftline' }).command, '/opt/My Tools/draftline'); // spaces kept
    assert.equal((launch({}) as any).cwd, undefined);
    const custom = launch({ 'server.args': ['serve', '--config', '~/d.toml', '${workspaceFolder}/x'], 'server.env': { HF_HOME: '~/hf' } });
    assert.deepEqual(custom.args, ['serve', '--config', '/home/me/d.toml', '/ws/proj/x']);
    assert.equal(custom.env.HF_HOME, '/home/me/hf');
    // no folder open: relative paths and ${workspaceFolder} are left as written
    const alone = serverLaunch(settings({ 'server.command': '.venv/bin/draftline' }), {}, { home: '/home/me' });
    assert.equal(alone.command, '.venv/bin/draftline');
  });

  test('an empty or blank server.command (a cleared setting) runs the default `draftline`', () => {
    assert.equal(serverLaunch(settings({ 'server.command': '' }), {}).command, 'draftline');
    assert.equal(serverLaunch(settings({ 'server.command': '   ' }), {}).command, 'draftline');
    assert.equal(serverLaunch(settings({ 'server.command': ' /venv/bin/draftline ' }), {}).command, '/venv/bin/draftline');
  });

  test('initializationOptions and the didChangeConfiguration push carry the same mapped object', () => {
    const s = settings({ 'model.target': 'fake', 'completion.debounceMs': 15, languages: { '*': false, python: true } });
    const expected = { draftline: { model: { target: 'fake' }, completion: { debounce_ms: 15 } } };
    assert.deepEqual(clientConfig(s), {
      documentSelector: [
        { scheme: 'file', language: 'python' },
        { scheme: 'untitled', language: 'python' },
        { scheme: 'vscode-notebook-cell', language: 'python' },
      ],
      initializationOptions: expected,
    });
    assert.deepEqual(didChangeConfigurationParams(s), { settings: expected });
  });
});
