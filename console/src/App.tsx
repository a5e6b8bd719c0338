import { useEffect, useState, type ReactNode } from 'react';
import { App as AntApp, ConfigProvider, Grid, Layout, Menu, Segmented, Space, Typography, Button, theme } from 'antd';
import {
  ApiOutlined,
  AuditOutlined,
  LogoutOutlined,
  MenuOutlined,
  SafetyCertificateOutlined,
  ShopOutlined,
  UsergroupAddOutlined,
  UserOutlined,
} from '@ant-design/icons';
import enUS from 'antd/locale/en_US';
import zhCN from 'antd/locale/zh_CN';
import dayjs from 'dayjs';
import 'dayjs/locale/zh-cn';
import { Navigate, Route, Routes, useLocation, useNavigate } from 'react-router-dom';
import { setUnauthenticatedListener } from './api';
import { clearToken, readClaims, storedToken, storeToken, takeTokenFromLocation, tokenProblem } from './auth';
import { ErrorBoundary } from './ErrorBoundary';
import { useI18n, type Lang, type MessageKey } from './i18n';
import { BulkJobs } from './pages/BulkJobs';
import { CampaignLive } from './pages/CampaignLive';
import { Campaigns } from './pages/Campaigns';
import { Compensations } from './pages/Compensations';
import { Reconciliation } from './pages/Reconciliation';
import { SignIn } from './pages/SignIn';
import { UserCoupons } from './pages/UserCoupons';
import { Webhooks } from './pages/Webhooks';

type Session = { token: string | null; notice: MessageKey | null };

/** The token from the address bar, else this tab's stored one. */
const initialSession = (): Session => sessionOf(takeTokenFromLocation() ?? storedToken());

/** Signed in with `token`, kept for the tab; an unusable token signs out with its reason. */
function sessionOf(token: string | null): Session {
  if (token === null) return { token: null, notice: null };
  const problem = tokenProblem(token);
  if (problem) {
    clearToken();
    return { token: null, notice: problem === 'expired' ? 'tokenExpired' : problem === 'notAdmin' ? 'tokenNotAdmin' : 'tokenMalformed' };
  }
  storeToken(token);
  return { token, notice: null };
}

const NAV: { key: string; icon: ReactNode; label: MessageKey }[] = [
  { key: '/campaigns', icon: <ShopOutlined />, label: 'navCampaigns' },
  { key: '/users', icon: <UserOutlined />, label: 'navUsers' },
  { key: '/bulk', icon: <UsergroupAddOutlined />, label: 'navBulk' },
  { key: '/reconciliation', icon: <AuditOutlined />, label: 'navReconciliation' },
  { key: '/compensations', icon: <SafetyCertificateOutlined />, label: 'navCompensations' },
  { key: '/webhooks', icon: <ApiOutlined />, label: 'navWebhooks' },
];

const MAX_TIMER_MS = 2 ** 31 - 1;

export function App() {
  const { lang, setLang, t } = useI18n();
  const [session, setSession] = useState(initialSession);
  // Below Ant Design's lg breakpoint the menu hides behind a header button, so nothing floats over the
  // page; read before the first paint, or a narrow window would paint the menu open first.
  const [narrow, setNarrow] = useState(() => window.matchMedia('screen and (max-width: 991.98px)').matches);
  const [menuOpen, setMenuOpen] = useState(false);
  // A phone (below antd's sm, 576 px) has no room for the user's name and every label in the header.
  const phone = Grid.useBreakpoint().sm === false;
  const navigate = useNavigate();
  const location = useLocation();

  useEffect(() => {
    dayjs.locale(lang === 'zh-CN' ? 'zh-cn' : 'en');
    document.documentElement.lang = lang;
    document.title = t('appTitle');
  }, [lang, t]);

  const signOut = (notice: MessageKey | null) => {
    clearToken();
    setSession({ token: null, notice });
  };
  useEffect(() => setUnauthenticatedListener(() => setSession({ token: null, notice: 'sessionEnded' })), []);

  // A #token opened in a tab already on the console changes only the fragment: no reload, so no
  // initialSession. Taken here as at the start, and so removed from the address bar and history too.
  useEffect(() => {
    const onHashChange = () => {
      const token = takeTokenFromLocation();
      if (token !== null) setSession(sessionOf(token));
    };
    window.addEventListener('hashchange', onHashChange);
    return () => window.removeEventListener('hashchange', onHashChange);
  }, []);

  // Back to sign-in the moment the token expires, not at the next failed request.
  const exp = session.token ? readClaims(session.token)?.exp : undefined;
  useEffect(() => {
    if (exp === undefined) return;
    let timer: ReturnType<typeof setTimeout>;
    const arm = () => {
      const left = exp * 1000 - Date.now();
      // A delay past 2^31-1 ms (24.8 days) fires at once, and a token may live 31 days: waited in steps.
      timer = left > MAX_TIMER_MS ? setTimeout(arm, MAX_TIMER_MS) : setTimeout(() => signOut('tokenExpired'), Math.max(0, left));
    };
    arm();
    return () => clearTimeout(timer);
  }, [exp]);

  const languageSwitch = (
    <Segmented<Lang>
      data-testid="language"
      value={lang}
      onChange={setLang}
      options={[
        { label: 'English', value: 'en' },
        { label: '中文', value: 'zh-CN' },
      ]}
    />
  );

  const content = !session.token ? (
    <SignIn
      notice={session.notice}
      languageSwitch={languageSwitch}
      onSignIn={(token) => {
        storeToken(token);
        setSession({ token, notice: null });
      }}
    />
  ) : (
    <Layout style={{ minHeight: '100vh' }}>
      <Layout.Sider
        breakpoint="lg"
        onBreakpoint={setNarrow}
        collapsible
        collapsed={narrow && !menuOpen}
        trigger={null}
        collapsedWidth={0}
        width={220}
        theme="dark"
        // Narrow, the open menu lies over the page rather than beside it: beside, it pushed a phone's
        // page 220 pixels past the screen's edge.
        style={narrow ? { position: 'fixed', top: 0, bottom: 0, left: 0, zIndex: 1001, overflowY: 'auto' } : undefined}
      >
        <div style={{ color: '#fff', fontSize: 18, fontWeight: 600, padding: '18px 24px' }}>{t('appTitle')}</div>
        <Menu
          theme="dark"
          mode="inline"
          selectedKeys={NAV.filter((n) => location.pathname.startsWith(n.key)).map((n) => n.key)}
          items={NAV.map((n) => ({ key: n.key, icon: n.icon, label: t(n.label) }))}
          onClick={(e) => {
            navigate(e.key);
            setMenuOpen(false);
          }}
        />
      </Layout.Sider>
      {narrow && menuOpen && (
        <div
          data-testid="menu-mask"
          onClick={() => setMenuOpen(false)}
          style={{ position: 'fixed', inset: 0, zIndex: 1000, background: 'rgba(0, 0, 0, 0.45)' }}
        />
      )}
      <Layout>
        <Layout.Header
          style={{
            background: '#fff',
            padding: phone ? '0 12px' : '0 24px',
            display: 'flex',
            justifyContent: 'space-between',
            alignItems: 'center',
          }}
        >
          {narrow ? (
            <Button
              data-testid="menu-toggle"
              aria-label={t('menu')}
              aria-expanded={menuOpen}
              icon={<MenuOutlined />}
              onClick={() => setMenuOpen(!menuOpen)}
            />
          ) : (
            <span />
          )}
          <Space size={phone ? 'small' : 'large'}>
            {!phone && (
              <Typography.Text type="secondary">{t('signedInAs', { user: readClaims(session.token)?.sub ?? '?' })}</Typography.Text>
            )}
            {languageSwitch}
            {/* On a phone the icon alone, still named for screen readers. */}
            <Button icon={<LogoutOutlined />} aria-label={phone ? t('signOut') : undefined} onClick={() => signOut(null)}>
              {!phone && t('signOut')}
            </Button>
          </Space>
        </Layout.Header>
        <Layout.Content style={{ padding: phone ? 12 : 24 }}>
          <ErrorBoundary key={location.pathname} t={t} onBack={() => navigate('/campaigns')}>
            <Routes>
              <Route path="/campaigns" element={<Campaigns />} />
              <Route path="/campaigns/:couponId" element={<CampaignLive />} />
              <Route path="/users" element={<UserCoupons />} />
              <Route path="/bulk" element={<BulkJobs />} />
              <Route path="/reconciliation" element={<Reconciliation />} />
              <Route path="/reconciliation/:runId" element={<Reconciliation />} />
              <Route path="/compensations" element={<Compensations />} />
              <Route path="/webhooks" element={<Webhooks />} />
              <Route path="*" element={<Navigate to="/campaigns" replace />} />
            </Routes>
          </ErrorBoundary>
        </Layout.Content>
      </Layout>
    </Layout>
  );

  return (
    <ConfigProvider
      locale={lang === 'zh-CN' ? zhCN : enUS}
      theme={{ algorithm: theme.defaultAlgorithm, token: { colorPrimary: '#d4380d' } }}
    >
      <AntApp>{content}</AntApp>
    </ConfigProvider>
  );
}
