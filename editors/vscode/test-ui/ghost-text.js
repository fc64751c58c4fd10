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
const w = require('./workbench.js');

async function main() {
  const result = { steps: [] };
  const wb = await w.openWorkbench({
    files: { 'demo.py': 'def add(a, b):\n    \n' },
    settings: { 'draftline.serverSettings': { model: { options: { text: 'return a + b' } } } },
    result,
  });
  const { page, step } = wb;
  try {
    const item = await w.statusItem(page, result);

    await w.quickOpen(page, 'demo.py');
    const editor = page.locator('.editor-instance .monaco-editor').first();
    await editor.waitFor({ timeout: 30000 });
    await page.waitForFunction(() => (document.querySelector('.editor-instance .view-lines')?.textContent || '').replace(/\u00a0/g, ' ').includes('def add'), null, { timeout: 30000 });
    step('editor');

    // end of line 1, Enter: VS Code auto-indents the new line 2 and requests an inline suggestion (automatic trigger)
    await editor.locator('.view-lines').click();
    await page.keyboard.press('Control+Home');
    await page.keyboard.press('End');
    await page.keyboard.press('Enter');
    const ghost = w.ghostLocator(page);
    try {
      await ghost.first().waitFor({ timeout: 15000 });
    } catch {
      await page.keyboard.press('Alt+Backslash'); // editor.action.inlineSuggest.trigger
      await ghost.first().waitFor({ timeout: 15000 }).catch(() => undefined);
    }
    result.ghost = w.plain(((await ghost.allTextContents()) || []).join(''));
    step('ghost text');
    await w.screenshot(page, 'ghost.png');

    await page.keyboard.press('Tab');
    await page.waitForFunction(
      () => (document.querySelector('.editor-instance .view-lines')?.textContent || '').replace(/\u00a0/g, ' ').includes('return a + b'),
      null,
      { timeout: 10000 },
    ).catch(() => undefined);
    result.lines = await w.viewLines(editor);
    result.ghost_after_tab = await ghost.count();
    result.accepted = result.lines.some((l) => l === '    return a + b') && result.ghost_after_tab === 0;
    step('accepted');
    await w.waitAccepted(page, item, result);
  } catch (err) {
    await w.recordError(result, err, page);
  } finally {
    await wb.close();
  }
  w.finish(result, !result.error && (result.ghost || '').includes('return a + b') && result.accepted && result.server_accepted);
}

w.run(main);
