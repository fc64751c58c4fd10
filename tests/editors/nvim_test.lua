-- Headless: env DRAFTLINE_PY, REPO, OUT, FILE. Writes key=value lines to OUT.
local out = io.open(os.getenv("OUT"), "w")
local function w(s) out:write(s .. "\n"); out:flush() end
vim.opt.rtp:prepend(os.getenv("REPO") .. "/editors/nvim")
vim.cmd("filetype on")
-- the user's own global 'completeopt' (their init.lua): the 0.11 fallback must keep these flags
vim.o.completeopt = "menu,menuone,noinsert,popup"
-- the fake engine appends its text to whatever is typed: 0.11 types "return" before completing
local fake_text = vim.lsp.inline_completion and "return a + b" or " a + b"
require("draftline").setup({
  cmd = { os.getenv("DRAFTLINE_PY"), "-m", "lsp_server", "serve" },
  settings = { model = { target = "fake", options = { text = fake_text } }, completion = { debounce_ms = 0 }, index = { enabled = false } },
})
-- Calls cond every 50 ms from the main loop, so typed keys and LSP replies are handled in between
-- (vim.wait would not take typeahead), then k(true), or k(false) after timeout_ms.
local function wait_for(cond, timeout_ms, k)
  local deadline = vim.uv.hrtime() + timeout_ms * 1e6
  local function poll()
    if cond() then return k(true) end
    if vim.uv.hrtime() > deadline then return k(false) end
    vim.defer_fn(poll, 50)
  end
  vim.defer_fn(poll, 0)
end
local function tab_map() return vim.fn.maparg("<Tab>", "i", false, true).desc or "" end
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
-- the keymaps are draftline's buffers' own: another buffer keeps its <Tab>
w("tab_here=" .. tab_map())
w("tab_elsewhere=" .. vim.api.nvim_buf_call(vim.api.nvim_create_buf(true, false), tab_map))
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
  w("completeopt=" .. vim.bo.completeopt)
  w("completeopt_effective=" .. vim.api.nvim_get_option_value("completeopt", {}))
  w("completeopt_global=" .. vim.go.completeopt)
  -- typed as a person would: each key's InsertCharPre is what autotrigger listens to
  vim.api.nvim_feedkeys("Areturn", "nt", false)
  local function draftline_item()
    local info = vim.fn.complete_info({ "pum_visible", "items" })
    if info.pum_visible ~= 1 then return nil end
    for _, item in ipairs(info.items) do
      if item.abbr == "return a + b" then return item end
    end
  end
  -- the menu may come up before the last keys of "return" are typed (autotrigger fires per key): wait
  -- for the whole word and draftline's item in the menu, whichever comes last
  wait_for(function() return vim.api.nvim_get_current_line() == "    return" and draftline_item() end, 30000, function(shown)
    local item = draftline_item()
    w("pum=" .. tostring(shown))
    w("label=" .. (item and item.abbr or ""))
    w("typed=" .. vim.api.nvim_get_current_line()) -- noselect: the menu inserted nothing by itself
    w("selected=" .. vim.fn.complete_info({ "selected" }).selected)
    vim.api.nvim_feedkeys(vim.keycode("<C-n><C-y><Esc>"), "nt", false)
    wait_for(function() return vim.fn.mode() == "n" end, 5000, function()
      w("line2=" .. vim.api.nvim_buf_get_lines(0, 1, 2, false)[1])
      vim.wait(10000, function() local s = require("draftline").status(0); return s and s.accepted > 0 end, 100)
      w("server_accepted=" .. tostring(require("draftline").status(0).accepted))
      out:close()
      vim.cmd("qa!")
    end)
  end)
end
