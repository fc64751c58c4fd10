/**
 * The extension's server lifecycle (src/extension.ts), run in plain Node: `vscode` and
 * vscode-languageclient are replaced by fakes that keep what the real ones do here: a client calls
 * `initializationOptions` (a function: its result) on every initialize, including its own restart of
 * a crashed server; stop() takes a while (shutdown request, process exit).
 */
import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import type * as Extension from '../src/extension';

enum State { Stopped = 1, Running = 2, Starting = 3 }

const tick = () => new Promise<void>((resolve) => setImmediate(resolve));

class FakeClient {
  static all: FakeClient[] = [];
  state = State.Stopped;
  inits: unknown[] = []; // the initializationOptions of each initialize
  notifications: unknown[] = [];

  constructor(_id: string, _name: string, readonly server: { command: string; args: string[] }, readonly options: any) {
    FakeClient.all.push(this);
  }

  private async initialize(): Promise<void> {
    this.state = State.Starting;
    const init = this.options.initializationOptions;
    this.inits.push(typeof init === 'function' ? init() : init);
    await tick();
    this.state = State.Running;
  }

  start(): Promise<void> {
    return this.initialize();
  }

  /** What vscode-languageclient does when the server process dies: start it again, initialize again. */
  crashAndRestart(): Promise<void> {
    return this.initialize();
  }

  async stop(): Promise<void> {
    for (let i = 0; i < 5; i++) await tick();
    this.state = State.Stopped;
  }

  async sendNotification(_type: unknown, params: unknown): Promise<void> {
    this.notifications.push(params);
  }

  async sendRequest(): Promise<unknown> {
    return {};
  }
}

let user: Record<string, unknown> = {};
let configListener: ((e: { affectsConfiguration(section: string): boolean }) => void) | undefined;
const commands: Record<string, () => Promise<void>> = {};
const disposable = { dispose() {} };

const fakeVscode = {
  workspace: {
    getConfiguration: () => ({ get: (key: string) => user[key], inspect: () => undefined, update: async () => undefined }),
    onDidChangeConfiguration: (listener: typeof configListener) => ((configListener = listener), disposable),
  },
  window: {
    state: { focused: false },
    createOutputChannel: () => ({ info() {}, show() {}, dispose() {} }),
    createStatusBarItem: () => ({ show() {}, dispose() {} }),
    onDidChangeWindowState: () => disposable,
    showErrorMessage: async () => undefined,
    showInformationMessage: async () => undefined,
  },
  commands: {
    registerCommand: (name: string, run: () => Promise<void>) => ((commands[name] = run), disposable),
    executeCommand: async () => undefined,
  },
  StatusBarAlignment: { Left: 1, Right: 2 },
  ConfigurationTarget: { Global: 1, Workspace: 2, WorkspaceFolder: 3 },
  ThemeColor: class {},
};
const fakeClientModule = {
  LanguageClient: FakeClient,
  State,
  DidChangeConfigurationNotification: { type: { method: 'workspace/didChangeConfiguration' } },
};

// the extension's own `require`s get the fakes (this file runs in a process of its own: node --test)
const Module = require('node:module');
const load = Module._load;
Module._load = function (this: unknown, request: string, ...rest: unknown[]) {
  if (request === 'vscode') return fakeVscode;
  if (request === 'vscode-languageclient/node') return fakeClientModule;
  return load.call(this, request, ...rest);
};
const extension: typeof Extension = require('../src/extension');

let context: { subscriptions: { dispose(): unknown }[] };

async function activate(settings: Record<string, unknown>): Promise<void> {
  user = settings;
  FakeClient.all = [];
  context = { subscriptions: [] };
  await extension.activate(context as any);
}

/** The user edits settings.json: VS Code fires onDidChangeConfiguration. */
function change(settings: Record<string, unknown>): void {
  user = { ...user, ...settings };
  configListener!({ affectsConfiguration: (section) => section === 'draftline' });
}

/** Until the extension's queued work is done (each fake step takes a few ticks). */
async function settle(): Promise<void> {
  for (let i = 0; i < 100; i++) await tick();
}

const alive = () => FakeClient.all.filter((c) => c.state !== State.Stopped);

afterEach(async () => {
  await extension.deactivate();
  for (const d of context.subscriptions) d.dispose(); // the poll timer
});

test('activate starts one server with the settings as initializationOptions', async () => {
  await activate({ 'model.target': 'fake' });
  assert.equal(FakeClient.all.length, 1);
  assert.deepEqual(FakeClient.all[0].inits, [{ draftline: { model: { target: 'fake' } } }]);
});

test('a crashed server restarted by vscode-languageclient gets the current settings, not those of the start', async () => {
  await activate({ 'model.target': 'fake', 'completion.debounceMs': 10 });
  change({ 'completion.debounceMs': 20 }); // travels by didChangeConfiguration, no restart
  await settle();
  const [client] = FakeClient.all;
  assert.equal(FakeClient.all.length, 1);
  assert.deepEqual(client.notifications, [{ settings: { draftline: { model: { target: 'fake' }, completion: { debounce_ms: 20 } } } }]);
  await client.crashAndRestart();
  assert.deepEqual(client.inits.at(-1), { draftline: { model: { target: 'fake' }, completion: { debounce_ms: 20 } } });
});

test('after such a restart, what the server was initialized with decides restarts', async () => {
  await activate({ 'model.target': 'fake' });
  change({ 'completion.debounceMs': 20 });
  await settle();
  await FakeClient.all[0].crashAndRestart(); // initialized with debounce_ms 20 this time
  change({ 'completion.debounceMs': null }); // unset: only a restart drops the 20 of initializationOptions
  await settle();
  assert.equal(FakeClient.all.length, 2);
  assert.deepEqual(FakeClient.all[1].inits, [{ draftline: { model: { target: 'fake' } } }]);
  change({ 'server.command': '/other/draftline' }); // another process: a restart, with that command
  await settle();
  assert.equal(FakeClient.all.length, 3);
  assert.equal(FakeClient.all[2].server.command, '/other/draftline');
  assert.deepEqual(alive(), [FakeClient.all[2]]);
});

test('two quick changes that each need a restart leave exactly one server running', async () => {
  await activate({ 'model.target': 'fake' });
  change({ 'server.args': ['serve', '-v'] });
  change({ 'server.args': ['serve', '-vv'] }); // while the first restart is still stopping the old server
  await settle();
  assert.equal(alive().length, 1, `running: ${alive().map((c) => c.server.args.join(' '))}`);
  assert.deepEqual(alive()[0].server.args, ['serve', '-vv']);
});

test('Restart Server twice in a row with a change between: one server, with the last settings', async () => {
  await activate({ 'model.target': 'fake' });
  const first = commands['draftline.restart']();
  change({ 'model.target': 'other' });
  const second = commands['draftline.restart']();
  await Promise.all([first, second]);
  await settle();
  assert.equal(alive().length, 1, `running: ${alive().length}`);
  assert.deepEqual(alive()[0].inits.at(-1), { draftline: { model: { target: 'other' } } });
});

test('deactivate while a restart is queued: no server is left running', async () => {
  await activate({ 'model.target': 'fake' });
  change({ 'server.args': ['serve', '-v'] });
  await extension.deactivate();
  await settle();
  assert.deepEqual(alive(), []);
});
