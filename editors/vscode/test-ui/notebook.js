#!/usr/bin/env node
/**
 * A Jupyter notebook in a real VS Code workbench: code-server with the packaged draftline.vsix, driven
 * by Chromium through playwright-core (the setup of ghost-text.js, shared in workbench.js). Opens the
 * notebook NOTEBOOK (copied into the workspace under its own name) in the built-in ipynb notebook
 * editor (no kernel: editing only), puts the cursor at the end of its last code cell, presses Enter
 * (an automatic inline trigger), waits for ghost text in that cell's editor, accepts it with Tab, and
 * saves the notebook (Ctrl+S) so the cell's text can be read back from the .ipynb on disk.
 *
 * The fake engine runs without a fixed text: its answer `fake_{len(prefix)}_{last word}` tells the
 * caller how much text the server saw before the cursor, so whether the earlier cells were included.
 *
 * Env: as workbench.js, plus NOTEBOOK (the .ipynb to open). Prints one JSON line (also written to OUT):
 * ghost (the ghost text in the cell), lines (the cell's lines after Tab), saved_sources (every cell's
 * source in the saved .ipynb), server_accepted (the status bar's acceptance rose above 0%), steps, error.
 * Exit 0 only when ghost text was shown, Tab accepted it, and the saved cell holds it.
 */
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const w = require('./workbench.js');

const cellSource = (cell) => (Array.isArray(cell.source) ? cell.source.join('') : cell.source || '');

async function main() {
  const result = { steps: [] };
  const notebook = w.env('NOTEBOOK');
  const name = path.basename(notebook);
  const cells = JSON.parse(fs.readFileSync(notebook, 'utf8')).cells;
  const codeCells = cells.filter((c) => c.cell_type === 'code');
  const last = cellSource(codeCells[codeCells.length - 1]);
  const firstLine = last.split('\n')[0];
  const wb = await w.openWorkbench({ files: { [name]: fs.readFileSync(notebook, 'utf8') }, result });
  const { page, workspace, step } = wb;
  const saved = path.join(workspace, name);
  try {
    const item = await w.statusItem(page, result);

    await w.quickOpen(page, name);
    const rows = page.locator('.notebook-editor .code-cell-row');
    await w.until(async () => (await rows.count()) === codeCells.length, 60000,
      `the notebook editor shows ${codeCells.length} code cells`);
    const cell = rows.nth(codeCells.length - 1);
    const editor = cell.locator('.monaco-editor').first();
    await w.until(async () => (await w.viewLines(editor).catch(() => [])).includes(firstLine), 30000,
      `the last code cell's editor shows ${JSON.stringify(firstLine)}`);
    result.cell_status = (await cell.locator('.cell-statusbar-container').allTextContents().catch(() => [])).map(w.plain);
    step('notebook');

    // into the cell's editor (edit mode), to the end of its text, Enter: Python auto-indents the new line
    // and VS Code asks the cell's inline completion providers (an automatic trigger)
    await editor.locator('.view-lines').click();
    await w.until(() => editor.evaluate((e) => e.classList.contains('focused')), 15000, 'the cell editor has focus');
    await page.keyboard.press('Control+End');
    await page.keyboard.press('Enter');
    const ghost = w.ghostLocator(editor);
    try {
      await ghost.first().waitFor({ timeout: 20000 });
    } catch {
      result.manual_trigger = true;
      await page.keyboard.press('Alt+Backslash'); // editor.action.inlineSuggest.trigger
      await ghost.first().waitFor({ timeout: 20000 });
    }
    // the decoration can appear before its text is filled in: wait for non-empty text
    result.ghost = await w.until(async () => w.plain((await ghost.allTextContents()).join('')).trim(), 15000,
      'the ghost text has text');
    step('ghost text');
    await w.screenshot(page, 'notebook-ghost.png');

    await page.keyboard.press('Tab');
    await w.until(async () => (await ghost.count()) === 0 && (await w.viewLines(editor)).some((l) => l.includes(result.ghost)),
      15000, 'Tab put the ghost text into the cell');
    result.lines = await w.viewLines(editor);
    step('accepted');
    await w.waitAccepted(page, item, result);

    // save: the cell's text as the notebook serializer writes it
    await page.keyboard.press('Control+S');
    result.saved_sources = await w.until(() => {
      try {
        const sources = JSON.parse(fs.readFileSync(saved, 'utf8')).cells.map(cellSource);
        return sources.some((s) => s.includes(result.ghost)) ? sources : null;
      } catch {
        return null; // not written yet, or written halfway
      }
    }, 30000, `${name} saved with the accepted text`);
    step('saved');
  } catch (err) {
    await w.recordError(result, err, page);
  } finally {
    await wb.close();
  }
  w.finish(result, !result.error && result.ghost && result.saved_sources);
}

w.run(main);
