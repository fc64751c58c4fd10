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

  requests = 0; // draftline/status requests sent to this client

  async sendRequest(): Promise<unknown> {
    this.requests++;
    return FakeClient.respond(this);
  }

  /** How the server answers draftline/status (a test may hold the answer back). */
  static respond: (client: FakeClient) => Promise<unknown> = async () => ({});
}

/** A promise and its resolve, for answers a test holds back. */
function deferred<T>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

enum LogLevel { Off = 0, Trace = 1, Debug = 2, Info = 3, Warning = 4, Error = 5 }

class EventEmitter<T> {
  private listeners: ((value: T) => void)[] = [];
  event = (listener: (value: T) => void) => (this.listeners.push(listener), { dispose() {} });
  fire(value: T): void {
    for (const l of this.listeners) l(value);
  }
  dispose(): void {
    this.listeners = [];
  }
}

/** The *draftline* output channel (a LogOutputChannel at the default Info level): the lines it shows. */
const outputLines: { level: LogLevel; message: string }[] = [];
const logAt = (level: LogLevel) => (message: string) => {
  if (level >= LogLevel.Info) outputLines.push({ level, message }); // below the channel's level: dropped
};

let user: Record<string, unknown> = {};
let configListener: ((e: { affectsConfiguration(section: string): boolean }) => void) | undefined;
let focusListener: ((state: { focused: boolean }) => void) | undefined;
const commands: Record<string, () => Promise<void>> = {};
const disposable = { dispose() {} };
const item = { text: '', tooltip: '' as unknown, show() {}, dispose() {} }; // the status bar item
let pickInMessage: string | undefined; // what the user picks in showInformationMessage

const fakeVscode = {
  workspace: {
    workspaceFolders: undefined as { uri: { scheme: string; fsPath: string } }[] | undefined,
    getConfiguration: () => ({
      get: (key: string, fallback?: unknown) => (key in user ? user[key] : fallback),
      inspect: () => undefined,
      update: async () => undefined,
    }),
    onDidChangeConfiguration: (listener: typeof configListener) => ((configListener = listener), disposable),
  },
  window: {
    state: { focused: false },
    createOutputChannel: () => ({
      name: 'draftline',
      logLevel: LogLevel.Info,
      onDidChangeLogLevel: () => disposable,
      trace: logAt(LogLevel.Trace),
      debug: logAt(LogLevel.Debug),
      info: logAt(LogLevel.Info),
      warn: logAt(LogLevel.Warning),
      error: logAt(LogLevel.Error),
      show() {},
      dispose() {},
    }),
    createStatusBarItem: () => item,
    onDidChangeWindowState: (listener: typeof focusListener) => ((focusListener = listener), disposable),
    showErrorMessage: async () => undefined,
    showInformationMessage: async () => pickInMessage,
  },
  commands: {
    registerCommand: (name: string, run: () => Promise<void>) => ((commands[name] = run), disposable),
    executeCommand: async () => undefined,
  },
  StatusBarAlignment: { Left: 1, Right: 2 },
  ConfigurationTarget: { Global: 1, Workspace: 2, WorkspaceFolder: 3 },
  ThemeColor: class {},
  EventEmitter,
  LogLevel,
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

/** Activation without waiting for it (a test that checks it does not hang). */
function activateInBackground(settings: Record<string, unknown>): Promise<void> {
  user = settings;
  FakeClient.all = [];
  context = { subscriptions: [] };
  return extension.activate(context as any);
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
  FakeClient.respond = async () => ({});
  fakeVscode.workspace.workspaceFolders = undefined;
  pickInMessage = undefined;
  outputLines.length = 0;
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

test('a server slow to answer draftline/status gets one status request at a time, not one per tick', { timeout: 10000 }, async () => {
  const answer = deferred<unknown>();
  FakeClient.respond = () => answer.promise; // e.g. a machine busy loading a model
  const activated = activateInBackground({ 'model.target': 'fake' });
  try {
    await settle();
    const [client] = FakeClient.all;
    for (let i = 0; i < 5; i++) focusListener!({ focused: true }); // the window regains focus, the interval ticks...
    await settle();
    assert.equal(client.requests, 1, `draftline/status requests in flight: ${client.requests}`);
  } finally {
    answer.resolve({ engine: { state: 'ready' } });
    await activated;
  }
  await settle();
  FakeClient.respond = async () => ({ engine: { state: 'ready' } });
  focusListener!({ focused: true }); // answered: the next poll asks again
  await settle();
  assert.equal(FakeClient.all[0].requests, 2);
});

test('a settings change asks for the status again once a poll already in flight is answered (that answer predates it)', { timeout: 10000 }, async () => {
  const answer = deferred<unknown>();
  FakeClient.respond = () => answer.promise;
  const activated = activateInBackground({ 'model.target': 'fake' });
  await settle();
  const [client] = FakeClient.all;
  assert.equal(client.requests, 1);
  FakeClient.respond = async () => ({ engine: { state: 'ready' } });
  change({ 'model.target': 'fake', 'completion.maxTokens': 16 }); // sent to the server as a notification
  await settle();
  assert.equal(client.requests, 1, 'one request at a time');
  answer.resolve({ engine: { state: 'loading' } });
  await activated;
  await settle();
  assert.equal(client.requests, 2, 'the status after the change was never asked for');
});

test('Restart Server and deactivate work while the server never answers draftline/status', { timeout: 10000 }, async () => {
  const never = deferred<unknown>();
  FakeClient.respond = (client) => (client === FakeClient.all[0] ? never.promise : Promise.resolve({}));
  const activated = activateInBackground({ 'model.target': 'fake' });
  try {
    await settle();
    assert.equal(FakeClient.all.length, 1);
    const restarted = commands['draftline.restart']();
    await settle();
    assert.equal(FakeClient.all.length, 2, 'Restart Server waited on the unanswered status request');
    assert.deepEqual(alive(), [FakeClient.all[1]]);
    await restarted;
  } finally {
    never.resolve(undefined);
    await activated;
  }
});

test("Show Status offers its menu (Restart) even when the server does not answer draftline/status", { timeout: 10000 }, async () => {
  const never = deferred<unknown>();
  FakeClient.respond = (client) => (client === FakeClient.all[0] ? never.promise : Promise.resolve({}));
  void activateInBackground({ 'model.target': 'fake' });
  try {
    await settle();
    pickInMessage = 'Restart';
    const shown = commands['draftline.showStatus']();
    await Promise.race([shown, new Promise((resolve) => setTimeout(resolve, 5000))]); // it waits a second at most
    await settle();
    assert.equal(FakeClient.all.length, 2, 'the status menu never came up');
    assert.deepEqual(alive(), [FakeClient.all[1]]);
  } finally {
    never.resolve(undefined);
  }
});

test("the old server's late status answer does not overwrite the new server's after a restart", async () => {
  const late = deferred<unknown>();
  FakeClient.respond = (client) => {
    if (client !== FakeClient.all[0]) return Promise.resolve({ engine: { state: 'ready' }, latency_ms: { count: 1, p50: 5 } });
    return client.requests === 1 ? Promise.resolve({ engine: { state: 'ready' } }) : late.promise;
  };
  await activate({ 'model.target': 'fake' });
  await settle();
  focusListener!({ focused: true }); // a poll to the first server, still unanswered when...
  await settle();
  await commands['draftline.restart'](); // ...the user restarts it
  await settle();
  assert.match(item.text, /^\$\(sparkle\) draftline 5 ms/);
  late.resolve({ engine: { state: 'failed', error: 'old' } }); // the old server answers at last
  await settle();
  assert.match(item.text, /^\$\(sparkle\) draftline 5 ms/, `status bar: ${item.text}`);
});

test('enable: false at startup starts no server (no model loaded, nothing indexed) until it is turned on', async () => {
  await activate({ 'model.target': 'fake', enable: false });
  await settle();
  assert.equal(FakeClient.all.length, 0);
  assert.equal(item.text, '$(circle-slash) draftline off');
  change({ 'completion.debounceMs': 5 }); // another change while off: still none
  await settle();
  assert.equal(FakeClient.all.length, 0);
  change({ enable: true });
  await settle();
  assert.equal(alive().length, 1);
  assert.deepEqual(alive()[0].inits, [{ draftline: { model: { target: 'fake' }, completion: { debounce_ms: 5 } } }]);
  change({ enable: false }); // turned off again: the running server is kept, for a quick turn on
  await settle();
  assert.equal(FakeClient.all.length, 1);
  assert.equal(item.text, '$(circle-slash) draftline off');
});

test('a settings change starts a server again after vscode-languageclient gave up restarting a crashing one', async () => {
  await activate({ 'model.target': 'bad' });
  FakeClient.all[0].state = State.Stopped; // crashed 5 times in 3 minutes: the client stays stopped
  change({ 'model.target': 'fake' }); // the user fixes what made it crash
  await settle();
  assert.equal(FakeClient.all.length, 2);
  assert.deepEqual(alive(), [FakeClient.all[1]]);
  assert.deepEqual(FakeClient.all[1].inits, [{ draftline: { model: { target: 'fake' } } }]);
});

test('a relative or ~ server.command is resolved (against the workspace folder, the home directory)', async () => {
  fakeVscode.workspace.workspaceFolders = [{ uri: { scheme: 'file', fsPath: '/ws/project' } }];
  await activate({ 'server.command': '.venv/bin/draftline', 'server.args': ['serve', '--config', '${workspaceFolder}/d.toml'] });
  const [client] = FakeClient.all;
  assert.equal(client.server.command, '/ws/project/.venv/bin/draftline');
  assert.deepEqual(client.server.args, ['serve', '--config', '/ws/project/d.toml']);
  assert.equal((client.server as any).options.cwd, undefined);
  change({ 'server.command': '~/venvs/dl/bin/draftline' });
  await settle();
  assert.equal(alive()[0].server.command, `${require('node:os').homedir()}/venvs/dl/bin/draftline`);
});

// vscode-languageclient's own trace switch (client.js BaseLanguageClient.refreshTrace), run on the channel the
// extension hands it: the real function, with `vscode` the fake above
const realClient = (() => {
  // its other modules extend vscode classes when they load: those get stand-ins, the rest is the fake above
  const forLibrary = new Proxy(fakeVscode, { get: (target: any, key) => (key in target ? target[key] : class {}) });
  Module._load = function (this: unknown, request: string, ...rest: unknown[]) {
    if (request === 'vscode') return forLibrary;
    return load.call(this, request, ...rest);
  };
  try {
    return require(require('node:path').join(require.resolve('vscode-languageclient/node'), '..', '..', 'common', 'client.js'));
  } finally {
    Module._load = function (this: unknown, request: string, ...rest: unknown[]) {
      if (request === 'vscode') return fakeVscode;
      if (request === 'vscode-languageclient/node') return fakeClientModule;
      return load.call(this, request, ...rest);
    };
  }
})();

/** The trace level the real client sets for this channel and the current settings (0 = off). */
function clientTrace(channel: any): number {
  let level = -1;
  const self = { _id: 'draftline', _traceLogLevel: channel.logLevel, _tracer: {}, error() {} };
  realClient.BaseLanguageClient.prototype.refreshTrace.call(self, {
    trace: async (value: number) => void (level = value),
  });
  return level;
}

test('draftline.trace.server alone shows the LSP trace in the draftline channel (vscode-languageclient 10 gates it on the log level)', async () => {
  await activate({ 'model.target': 'fake', 'trace.server': 'messages' });
  const options = FakeClient.all[0].options;
  const channel = options.traceOutputChannel ?? options.outputChannel; // what the client traces into
  assert.equal(clientTrace(channel), 1, 'the client left the trace off'); // Trace.Messages
  channel.trace("Sending request 'textDocument/inlineCompletion - (3)'.");
  assert.ok(outputLines.some((l) => l.message.includes('textDocument/inlineCompletion')), 'the trace line was dropped');

  let levelChanged = 0;
  channel.onDidChangeLogLevel(() => levelChanged++);
  change({ 'trace.server': 'off' });
  await settle();
  assert.equal(levelChanged, 1); // the client re-reads the trace setting on this event
  assert.equal(clientTrace(channel), 0);
  change({ 'trace.server': 'verbose' });
  await settle();
  assert.equal(clientTrace(channel), 3); // Trace.Verbose
});
