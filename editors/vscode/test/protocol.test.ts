/**
 * The messages the extension sends, on VS Code's own protocol stack (vscode-jsonrpc +
 * vscode-languageserver-protocol, the libraries inside vscode-languageclient), against the real
 * `draftline serve` on the fake engine: initialize with the mapped initializationOptions,
 * didOpen, inlineCompletion, didChange, the accept command, draftline/status, didChangeConfiguration, $/cancelRequest, shutdown/exit.
 */
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { pathToFileURL } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { CancellationTokenSource, ResponseError } from 'vscode-jsonrpc/node';
import {
  ClientCapabilities,
  ConfigurationRequest,
  DidChangeConfigurationNotification,
  DidChangeTextDocumentNotification,
  DidOpenTextDocumentNotification,
  ExecuteCommandRequest,
  ExitNotification,
  InitializeRequest,
  InitializeResult,
  InitializedNotification,
  InlineCompletionItem,
  InlineCompletionList,
  InlineCompletionRequest,
  InlineCompletionTriggerKind,
  LSPErrorCodes,
  LogMessageNotification,
  RegistrationRequest,
  ShowMessageNotification,
  ShutdownRequest,
  WorkDoneProgressCreateRequest,
} from 'vscode-languageserver-protocol';
import { DEFAULTS, Settings, clientConfig, didChangeConfigurationParams, readSettings, serverLaunch } from '../src/settings';
import { STATUS_METHOD, STATUS_PARAMS, ServerStatus, statusView } from '../src/status';
import { Server, draftlineCommand, serverEnv, startServer, until } from './harness';

const ACCEPT_COMMAND = 'draftline.didAcceptCompletionItem'; // lsp_server/documents.py

/** What vscode-languageclient 10 declares for the features draftline uses (client/src/common/*.ts). */
const CAPABILITIES: ClientCapabilities = {
  workspace: {
    applyEdit: true,
    configuration: true,
    workspaceFolders: true,
    didChangeConfiguration: { dynamicRegistration: true },
    didChangeWatchedFiles: { dynamicRegistration: true, relativePatternSupport: true },
    executeCommand: { dynamicRegistration: true },
  },
  textDocument: {
    synchronization: { dynamicRegistration: true, willSave: true, willSaveWaitUntil: true, didSave: true },
    completion: { dynamicRegistration: true, contextSupport: true, completionItem: { snippetSupport: true } },
    inlineCompletion: { dynamicRegistration: true },
  },
  window: { workDoneProgress: true, showMessage: {}, showDocument: { support: true } },
  general: { positionEncodings: ['utf-16'] },
};

function settings(user: Record<string, unknown>): Settings {
  return readSettings((key) => (key in user ? user[key] : (DEFAULTS as Record<string, unknown>)[key]));
}

/** The user's settings in this test: the fake engine, no debounce, no index. */
const cmd = draftlineCommand();
const USER = {
  'server.command': cmd ?? 'draftline', // a virtualenv's bin/draftline; args stay the default ["serve"]
  'model.target': 'fake',
  'completion.debounceMs': 0,
  'completion.mode': 'multi',
  'index.enabled': false,
  serverSettings: { model: { options: { text: 'return a + b' } } },
};

describe('draftline serve over vscode-jsonrpc', { skip: cmd ? false : 'no draftline executable (set DRAFTLINE_CMD or DRAFTLINE_PY to a venv with draftline)' }, () => {
  let server: Server;
  let init: InitializeResult;
  let root: string;
  let uri: string;
  const errors: string[] = [];
  const registrations: string[] = [];
  const status = () => server.connection.sendRequest<ServerStatus & Record<string, any>>(STATUS_METHOD, STATUS_PARAMS);
  const ready = () => until(status, (s) => s.engine?.state === 'ready');
  const inline = (line: number, character: number, token?: CancellationTokenSource) =>
    server.connection.sendRequest(
      InlineCompletionRequest.type,
      { textDocument: { uri }, position: { line, character }, context: { triggerKind: InlineCompletionTriggerKind.Automatic } },
      token?.token,
    );

  before(async () => {
    root = fs.mkdtempSync(path.join(os.tmpdir(), 'draftline-vscode-'));
    fs.writeFileSync(path.join(root, 'demo.py'), 'def add(a, b):\n    \n');
    uri = pathToFileURL(path.join(root, 'demo.py')).href;
    const user = settings(USER);
    assert.deepEqual(user['server.args'], ['serve']);
    server = startServer(serverLaunch(user, serverEnv()), root);
    const c = server.connection;
    c.onRequest(RegistrationRequest.type, (p) => void registrations.push(...p.registrations.map((r) => r.method)));
    c.onRequest(WorkDoneProgressCreateRequest.type, () => {});
    c.onRequest(ConfigurationRequest.type, (p) => p.items.map(() => null));
    c.onNotification(ShowMessageNotification.type, (p) => {
      if (p.type === 1) errors.push(p.message);
    });
    c.onNotification(LogMessageNotification.type, (p) => {
      if (p.type === 1) errors.push(p.message);
    });
    c.listen();
    init = await c.sendRequest(InitializeRequest.type, {
      processId: process.pid,
      clientInfo: { name: 'Visual Studio Code', version: '1.139.1' },
      rootUri: pathToFileURL(root).href,
      workspaceFolders: [{ uri: pathToFileURL(root).href, name: 'demo' }],
      capabilities: CAPABILITIES,
      initializationOptions: clientConfig(user).initializationOptions,
    });
    await c.sendNotification(InitializedNotification.type, {});
  });

  after(async () => {
    if (!server) return;
    try {
      await server.connection.sendRequest(ShutdownRequest.type);
      await server.connection.sendNotification(ExitNotification.type);
    } finally {
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise((r) => (timer = setTimeout(() => r('timeout'), 10000)));
      const code = await Promise.race([server.exited, timeout]);
      clearTimeout(timer);
      server.connection.dispose();
      if (code === 'timeout') server.proc.kill();
      fs.rmSync(root, { recursive: true, force: true });
      assert.equal(code, 0, `server exit: ${code}\n${server.stderr().slice(-2000)}`);
    }
  });

  test('initialize advertises inline completion and the accept command', () => {
    assert.ok(init.capabilities.inlineCompletionProvider, JSON.stringify(init.capabilities));
    assert.ok(init.capabilities.executeCommandProvider?.commands.includes(ACCEPT_COMMAND));
    assert.equal(init.serverInfo?.name, 'draftline');
  });

  test('the engine from initializationOptions becomes ready', async () => {
    const s = await ready();
    assert.equal(s.engine?.target, 'fake');
    assert.equal(s.index?.state, 'none'); // index.enabled=false arrived too
    // the file watcher registration that vscode-languageclient answers with a FileSystemWatcher
    await until(async () => registrations, (r) => r.includes('workspace/didChangeWatchedFiles'));
  });

  test('didOpen + inlineCompletion returns the ghost text with an accept command', async () => {
    await server.connection.sendNotification(DidOpenTextDocumentNotification.type, {
      textDocument: { uri, languageId: 'python', version: 1, text: 'def add(a, b):\n    \n' },
    });
    const result = (await inline(1, 4)) as InlineCompletionList;
    assert.equal(result.items.length, 1, JSON.stringify(result));
    const item = result.items[0] as InlineCompletionItem;
    assert.equal(item.insertText, 'return a + b');
    assert.deepEqual(item.range, { start: { line: 1, character: 4 }, end: { line: 1, character: 4 } });
    assert.equal(item.command?.command, ACCEPT_COMMAND);

    // VS Code runs the item's command on accept; vscode-languageclient forwards it as executeCommand
    await server.connection.sendRequest(ExecuteCommandRequest.type, {
      command: item.command!.command,
      arguments: item.command!.arguments,
    });
    const s = await until(status, (x) => (x.accepted ?? 0) >= 1);
    assert.equal(s.answered, 1);
    assert.equal(s.acceptance_rate, 1);
    assert.equal(s.latency_ms?.count, 1);
    const view = statusView(s, true, true); // what the status bar would show for this answer
    assert.match(view.text, /^\$\(sparkle\) draftline \d+ ms · 100%$/);
    assert.equal(view.warning, false);
  });

  test('didChangeConfiguration with the mapped settings switches the engine', async () => {
    const changed = settings({ ...USER, serverSettings: { model: { options: { text: 'return b + a' } } } });
    await server.connection.sendNotification(DidChangeConfigurationNotification.type, didChangeConfigurationParams(changed));
    await until(status, (s) => s.engine?.state === 'ready' && s.requests === 1);
    await server.connection.sendNotification(DidChangeTextDocumentNotification.type, {
      textDocument: { uri, version: 2 },
      contentChanges: [{ text: 'def add(a, b):\n    \n' }],
    });
    const result = (await inline(1, 4)) as InlineCompletionList;
    assert.equal((result.items[0] as InlineCompletionItem)?.insertText, 'return b + a');
  });

  test('$/cancelRequest (a CancellationToken) answers RequestCancelled', async () => {
    const slow = settings({ ...USER, serverSettings: { model: { options: { text: 'abcdefghijklmnop', step_s: 0.25 } } } });
    await server.connection.sendNotification(DidChangeConfigurationNotification.type, didChangeConfigurationParams(slow));
    await until(status, (s) => s.engine?.state === 'ready' && s.requests === 2);
    const source = new CancellationTokenSource();
    const pending = inline(1, 4, source);
    setTimeout(() => source.cancel(), 400);
    await assert.rejects(pending, (err: unknown) => err instanceof ResponseError && err.code === LSPErrorCodes.RequestCancelled);
    const s = await until(status, (x) => x.generations?.in_flight === 0);
    assert.ok((s.cancellations ?? 0) + (s.engine_cancelled ?? 0) >= 1, JSON.stringify(s));
  });

  test('draftline/status without params is answered (JSON-RPC lets a request leave params out)', async () => {
    const s = (await server.connection.sendRequest(STATUS_METHOD)) as { engine?: { state?: string } };
    assert.ok(s.engine?.state, JSON.stringify(s));
  });

  test('the server reported no errors', () => {
    assert.deepEqual(errors, []);
  });
});
