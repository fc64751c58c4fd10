;; A real `emacs -nw' session (driven through a pty by test_emacs_session.py): env DRAFTLINE_PY,
;; REPO, FILE, DL_SOCKET (emacsclient's socket), DL_TEXT (the fake engine's text), DL_LISP (the
;; draftline.el folder; default the checkout's), DL_SETUP (optional Lisp run before eglot starts).
(add-to-list 'load-path (or (getenv "DL_LISP") (expand-file-name "editors/emacs" (getenv "REPO"))))
(require 'eglot) (require 'draftline) (require 'server)
(setq native-comp-async-report-warnings-errors nil)
(setq draftline-command (list (getenv "DRAFTLINE_PY") "-m" "lsp_server" "serve")
      draftline-settings `(:model (:target "fake" :options (:text ,(or (getenv "DL_TEXT") "return a + b")))
                           :completion (:debounce_ms 0) :index (:enabled :json-false))
      eglot-server-programs (list (cons draftline-modes (append (list 'draftline-eglot-server) draftline-command)))
      inhibit-startup-screen t make-backup-files nil auto-save-default nil create-lockfiles nil
      eglot-sync-connect nil)
(setq server-name (file-name-nondirectory (getenv "DL_SOCKET"))
      server-socket-dir (file-name-directory (getenv "DL_SOCKET")))
(server-start)
(when (getenv "DL_SETUP") (eval (car (read-from-string (getenv "DL_SETUP"))) t))
(find-file (getenv "FILE"))
(apply #'eglot (eglot--guess-contact))
