-- Headless: env DRAFTLINE_PY, REPO, OUT, FILE. Writes key=value lines to OUT.
local out = io.open(os.getenv("OUT"), "w")
local function w(s) out:write(s .. "\n"); out:flush() end
vim.opt.rtp:prepend(os.getenv("REPO") .. "/editors/nvim")
vim.cmd("filetype on")
require("draftline").setup({
  cmd = { os.getenv("DRAFTLINE_PY"), "-m", "lsp_server", "serve" },
  settings = { model = { target = "fake", options = { text = "return a + b" } }, completion = { debounce_ms = 0 }, index = { enabled = false } },
})
vim.cmd("edit " .. os.getenv("FILE"))
local ok = vim.wait(30000, function()
  local c = vim.lsp.get_clients({ name = "draftline", bufnr = 0 })[1]
  if not c or not c.initialized then return false end
  local s = require("draftline").status(0)
  return s ~= nil and s.engine.state == "ready"
end, 100)
w("ready=" .. tostring(ok))
local client = vim.lsp.get_clients({ name = "draftline", bufnr = 0 })[1]
if not ok then out:close(); vim.cmd("qa!") end
vim.api.nvim_win_set_cursor(0, { 2, 4 })
if vim.lsp.inline_completion then
  w("mode_inline=true")
  vim.cmd("startinsert!")
  local tries = 0
  local function poll()
    tries = tries + 1
    local shown = ""
    for name, nsid in pairs(vim.api.nvim_get_namespaces()) do
      for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, nsid, 0, -1, { details = true })) do
        if m[4].virt_text and name:find("inline") then
          for _, chunk in ipairs(m[4].virt_text) do shown = shown .. chunk[1] end
        end
      end
    end
    if shown == "" and tries < 300 then return vim.defer_fn(poll, 100) end
    w("ghost=" .. shown)
    w("accepted=" .. tostring(vim.lsp.inline_completion.get()))
    vim.defer_fn(function()
      w("line2=" .. vim.api.nvim_buf_get_lines(0, 1, 2, false)[1])
      vim.wait(10000, function() local s = require("draftline").status(0); return s and s.accepted > 0 end, 100)
      w("server_accepted=" .. tostring(require("draftline").status(0).accepted))
      out:close()
      vim.cmd("qa!")
    end, 500)
  end
  vim.defer_fn(poll, 300)
  return
else
  w("mode_inline=false")
  -- normal mode clamps the cursor onto the last char; an insert-mode cursor sits after it (col 4)
  local params = { textDocument = { uri = vim.uri_from_bufnr(0) }, position = { line = 1, character = 4 } }
  local res = client:request_sync("textDocument/completion", params, 30000, 0)
  local items = res and res.result and (res.result.items or res.result) or {}
  local item = items[1]
  w("label=" .. (item and item.label or ""))
  if item and item.textEdit then
    vim.lsp.util.apply_text_edits({ item.textEdit }, vim.api.nvim_get_current_buf(), client.offset_encoding)
  end
  w("line2=" .. vim.api.nvim_buf_get_lines(0, 1, 2, false)[1])
end
out:close()
vim.cmd("qa!")
