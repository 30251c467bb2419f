package main

// RBAC as kube-apiserver serves and enforces it (--authorization-mode=RBAC), over the
// served rbac.authorization.k8s.io/v1 objects. The authorizer, its rule resolution and the
// escalation checks on writes of Roles and bindings live in k8s.io/kubernetes, which Debian
// does not package; this file ports them, each function citing its source in Kubernetes
// v1.36 (unchanged since v1.30 but for the context argument). The rule comparison of the
// escalation checks is k8s.io/component-helpers/auth/rbac/validation.Covers, as packaged.
//
// Requests of the system:masters group are always allowed (authorizerfactory.NewPrivilegedGroups,
// placed first as pkg/kubeapiserver/authorizer/config.go does), as are the server's own
// loopback requests. The bootstrap ClusterRoles every cluster has that let any
// authenticated user read discovery and create SelfSubjectAccessReviews, and cluster-admin,
// are created at start (bootstrapPolicy). Not done: ClusterRole aggregation (a controller of
// kube-controller-manager), SelfSubjectRulesReview.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	rbacinformers "k8s.io/client-go/informers/rbac/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-helpers/auth/rbac/validation"
	"k8s.io/klog/v2"
)

// --- rule matching: pkg/apis/rbac/v1/evaluation_helpers.go and
// plugin/pkg/auth/authorizer/rbac/rbac.go (RuleAllows) of Kubernetes v1.36 ---------------

func verbMatches(rule *rbacv1.PolicyRule, verb string) bool {
	for _, v := range rule.Verbs {
		if v == rbacv1.VerbAll || v == verb {
			return true
		}
	}
	return false
}

func apiGroupMatches(rule *rbacv1.PolicyRule, group string) bool {
	for _, g := range rule.APIGroups {
		if g == rbacv1.APIGroupAll || g == group {
			return true
		}
	}
	return false
}

func resourceMatches(rule *rbacv1.PolicyRule, combinedResource, subresource string) bool {
	for _, r := range rule.Resources {
		if r == rbacv1.ResourceAll || r == combinedResource {
			return true
		}
		// "*/subresource" matches that subresource of every resource.
		if len(subresource) > 0 && len(r) == len(subresource)+2 &&
			strings.HasPrefix(r, "*/") && strings.HasSuffix(r, subresource) {
			return true
		}
	}
	return false
}

func resourceNameMatches(rule *rbacv1.PolicyRule, name string) bool {
	if len(rule.ResourceNames) == 0 {
		return true
	}
	for _, n := range rule.ResourceNames {
		if n == name {
			return true
		}
	}
	return false
}

func nonResourceURLMatches(rule *rbacv1.PolicyRule, path string) bool {
	for _, u := range rule.NonResourceURLs {
		if u == rbacv1.NonResourceAll || u == path ||
			(strings.HasSuffix(u, "*") && strings.HasPrefix(path, strings.TrimRight(u, "*"))) {
			return true
		}
	}
	return false
}

// ruleAllows: plugin/pkg/auth/authorizer/rbac/rbac.go (RuleAllows).
func ruleAllows(attrs authorizer.Attributes, rule *rbacv1.PolicyRule) bool {
	if attrs.IsResourceRequest() {
		combined := attrs.GetResource()
		if len(attrs.GetSubresource()) > 0 {
			combined = attrs.GetResource() + "/" + attrs.GetSubresource()
		}
		return verbMatches(rule, attrs.GetVerb()) &&
			apiGroupMatches(rule, attrs.GetAPIGroup()) &&
			resourceMatches(rule, combined, attrs.GetSubresource()) &&
			resourceNameMatches(rule, attrs.GetName())
	}
	return verbMatches(rule, attrs.GetVerb()) && nonResourceURLMatches(rule, attrs.GetPath())
}

// compactString: pkg/apis/rbac/v1/evaluation_helpers.go (CompactString), for messages.
func compactString(r rbacv1.PolicyRule) string {
	var parts []string
	if len(r.APIGroups) > 0 {
		parts = append(parts, fmt.Sprintf("APIGroups:%q", r.APIGroups))
	}
	if len(r.Resources) > 0 {
		parts = append(parts, fmt.Sprintf("Resources:%q", r.Resources))
	}
	if len(r.NonResourceURLs) > 0 {
		parts = append(parts, fmt.Sprintf("NonResourceURLs:%q", r.NonResourceURLs))
	}
	if len(r.ResourceNames) > 0 {
		parts = append(parts, fmt.Sprintf("ResourceNames:%q", r.ResourceNames))
	}
	if len(r.Verbs) > 0 {
		parts = append(parts, fmt.Sprintf("Verbs:%q", r.Verbs))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// --- rule resolution: pkg/registry/rbac/validation/rule.go of Kubernetes v1.36 -------------

// The four sources of rules; the authorizer reads them through informers, the escalation
// checks through the registry, as kube-apiserver does.
type roleSource interface {
	GetRole(ctx context.Context, namespace, name string) (*rbacv1.Role, error)
	ListRoleBindings(ctx context.Context, namespace string) ([]*rbacv1.RoleBinding, error)
	GetClusterRole(ctx context.Context, name string) (*rbacv1.ClusterRole, error)
	ListClusterRoleBindings(ctx context.Context) ([]*rbacv1.ClusterRoleBinding, error)
}

// ruleResolver is DefaultRuleResolver.
type ruleResolver struct{ source roleSource }

// rulesFor: DefaultRuleResolver.RulesFor.
func (r ruleResolver) rulesFor(ctx context.Context, u user.Info, namespace string) ([]rbacv1.PolicyRule, error) {
	var rules []rbacv1.PolicyRule
	var errs []error
	r.visitRulesFor(ctx, u, namespace, func(_ fmt.Stringer, rule *rbacv1.PolicyRule, err error) bool {
		if rule != nil {
			rules = append(rules, *rule)
		}
		if err != nil {
			errs = append(errs, err)
		}
		return true
	})
	return rules, utilerrors.NewAggregate(errs)
}

func describeSubject(s *rbacv1.Subject, bindingNamespace string) string {
	switch s.Kind {
	case rbacv1.ServiceAccountKind:
		if len(s.Namespace) > 0 {
			return fmt.Sprintf("%s %q", s.Kind, s.Name+"/"+s.Namespace)
		}
		return fmt.Sprintf("%s %q", s.Kind, s.Name+"/"+bindingNamespace)
	default:
		return fmt.Sprintf("%s %q", s.Kind, s.Name)
	}
}

type clusterRoleBindingDescriber struct {
	binding *rbacv1.ClusterRoleBinding
	subject *rbacv1.Subject
}

func (d *clusterRoleBindingDescriber) String() string {
	return fmt.Sprintf("ClusterRoleBinding %q of %s %q to %s", d.binding.Name, d.binding.RoleRef.Kind,
		d.binding.RoleRef.Name, describeSubject(d.subject, ""))
}

type roleBindingDescriber struct {
	binding *rbacv1.RoleBinding
	subject *rbacv1.Subject
}

func (d *roleBindingDescriber) String() string {
	return fmt.Sprintf("RoleBinding %q of %s %q to %s", d.binding.Name+"/"+d.binding.Namespace,
		d.binding.RoleRef.Kind, d.binding.RoleRef.Name, describeSubject(d.subject, d.binding.Namespace))
}

// visitRulesFor: DefaultRuleResolver.VisitRulesFor. ClusterRoleBindings first, then the
// RoleBindings of the request's namespace.
func (r ruleResolver) visitRulesFor(ctx context.Context, u user.Info, namespace string,
	visitor func(source fmt.Stringer, rule *rbacv1.PolicyRule, err error) bool) {
	if bindings, err := r.source.ListClusterRoleBindings(ctx); err != nil {
		if !visitor(nil, nil, err) {
			return
		}
	} else {
		describer := &clusterRoleBindingDescriber{}
		for _, binding := range bindings {
			i, applies := appliesTo(u, binding.Subjects, "")
			if !applies {
				continue
			}
			rules, err := r.getRoleReferenceRules(ctx, binding.RoleRef, "")
			if err != nil {
				if !visitor(nil, nil, err) {
					return
				}
				continue
			}
			describer.binding, describer.subject = binding, &binding.Subjects[i]
			for j := range rules {
				if !visitor(describer, &rules[j], nil) {
					return
				}
			}
		}
	}
	if len(namespace) == 0 {
		return
	}
	if bindings, err := r.source.ListRoleBindings(ctx, namespace); err != nil {
		visitor(nil, nil, err)
	} else {
		describer := &roleBindingDescriber{}
		for _, binding := range bindings {
			i, applies := appliesTo(u, binding.Subjects, namespace)
			if !applies {
				continue
			}
			rules, err := r.getRoleReferenceRules(ctx, binding.RoleRef, namespace)
			if err != nil {
				if !visitor(nil, nil, err) {
					return
				}
				continue
			}
			describer.binding, describer.subject = binding, &binding.Subjects[i]
			for j := range rules {
				if !visitor(describer, &rules[j], nil) {
					return
				}
			}
		}
	}
}

// getRoleReferenceRules: DefaultRuleResolver.GetRoleReferenceRules. A Role is looked up in
// the binding's namespace.
func (r ruleResolver) getRoleReferenceRules(ctx context.Context, ref rbacv1.RoleRef, bindingNamespace string) ([]rbacv1.PolicyRule, error) {
	switch ref.Kind {
	case "Role":
		role, err := r.source.GetRole(ctx, bindingNamespace, ref.Name)
		if err != nil {
			return nil, err
		}
		return role.Rules, nil
	case "ClusterRole":
		role, err := r.source.GetClusterRole(ctx, ref.Name)
		if err != nil {
			return nil, err
		}
		return role.Rules, nil
	default:
		return nil, fmt.Errorf("unsupported role reference kind: %q", ref.Kind)
	}
}

// appliesTo: the index of the first subject that is the user, and whether there is one.
func appliesTo(u user.Info, subjects []rbacv1.Subject, namespace string) (int, bool) {
	for i, s := range subjects {
		if appliesToUser(u, s, namespace) {
			return i, true
		}
	}
	return 0, false
}

// appliesToUser: a User subject by name, a Group by membership, a ServiceAccount by its
// user name (its namespace defaults to the binding's).
func appliesToUser(u user.Info, subject rbacv1.Subject, namespace string) bool {
	switch subject.Kind {
	case rbacv1.UserKind:
		return u.GetName() == subject.Name
	case rbacv1.GroupKind:
		for _, g := range u.GetGroups() {
			if g == subject.Name {
				return true
			}
		}
		return false
	case rbacv1.ServiceAccountKind:
		saNamespace := namespace
		if len(subject.Namespace) > 0 {
			saNamespace = subject.Namespace
		}
		if len(saNamespace) == 0 {
			return false
		}
		return serviceaccount.MatchesUsername(saNamespace, subject.Name, u.GetName())
	default:
		return false
	}
}

// --- the authorizer: plugin/pkg/auth/authorizer/rbac/rbac.go of Kubernetes v1.36 ---------

type rbacAuthorizer struct{ resolver ruleResolver }

// Authorize allows a request some rule bound to its user allows; otherwise it has no
// opinion (the request is then forbidden), giving the resolution errors as the reason.
func (a rbacAuthorizer) Authorize(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	var reason string
	var errs []error
	allowed := false
	a.resolver.visitRulesFor(ctx, attrs.GetUser(), attrs.GetNamespace(), func(source fmt.Stringer, rule *rbacv1.PolicyRule, err error) bool {
		if rule != nil && ruleAllows(attrs, rule) {
			allowed, reason = true, fmt.Sprintf("RBAC: allowed by %s", source.String())
			return false
		}
		if err != nil {
			errs = append(errs, err)
		}
		return true
	})
	if allowed {
		return authorizer.DecisionAllow, reason, nil
	}
	if klogV := klog.V(2); klogV.Enabled() {
		klogV.InfoS("RBAC: no rule allows", "user", attrs.GetUser().GetName(), "groups", attrs.GetUser().GetGroups(),
			"verb", attrs.GetVerb(), "group", attrs.GetAPIGroup(), "resource", attrs.GetResource(),
			"subresource", attrs.GetSubresource(), "name", attrs.GetName(), "namespace", attrs.GetNamespace(), "path", attrs.GetPath())
	}
	if len(errs) > 0 {
		reason = fmt.Sprintf("RBAC: %v", utilerrors.NewAggregate(errs))
	}
	return authorizer.DecisionNoOpinion, reason, nil
}

// informerRoles reads the RBAC objects through the server's informers (the RoleGetter,
// RoleBindingLister, ... adapters of rbac.go).
type informerRoles struct {
	roles               rbacinformers.RoleInformer
	roleBindings        rbacinformers.RoleBindingInformer
	clusterRoles        rbacinformers.ClusterRoleInformer
	clusterRoleBindings rbacinformers.ClusterRoleBindingInformer
}

func (i informerRoles) GetRole(_ context.Context, namespace, name string) (*rbacv1.Role, error) {
	return i.roles.Lister().Roles(namespace).Get(name)
}

func (i informerRoles) ListRoleBindings(_ context.Context, namespace string) ([]*rbacv1.RoleBinding, error) {
	return i.roleBindings.Lister().RoleBindings(namespace).List(labels.Everything())
}

func (i informerRoles) GetClusterRole(_ context.Context, name string) (*rbacv1.ClusterRole, error) {
	return i.clusterRoles.Lister().Get(name)
}

func (i informerRoles) ListClusterRoleBindings(context.Context) ([]*rbacv1.ClusterRoleBinding, error) {
	return i.clusterRoleBindings.Lister().List(labels.Everything())
}

// hasSynced reports whether all four informers have synced; a first call before the
// informer factory starts registers them with it.
func (i informerRoles) hasSynced() bool {
	synced := true
	for _, informer := range []cache.SharedIndexInformer{i.roles.Informer(), i.roleBindings.Informer(),
		i.clusterRoles.Informer(), i.clusterRoleBindings.Informer()} {
		synced = informer.HasSynced() && synced
	}
	return synced
}

// --- escalation checks on writes: pkg/registry/rbac/{escalation_check.go,helpers.go},
// pkg/registry/rbac/{role,clusterrole,rolebinding,clusterrolebinding}/policybased/storage.go
// and pkg/registry/rbac/validation/rule.go (ConfirmNoEscalation) of Kubernetes v1.36 ------

// registryRoles reads the RBAC objects from storage, for the escalation checks (the
// AuthorizerAdapter of each RBAC registry).
type registryRoles struct {
	roles, roleBindings, clusterRoles, clusterRoleBindings *genericregistry.Store
}

func (r *registryRoles) GetRole(ctx context.Context, namespace, name string) (*rbacv1.Role, error) {
	o, err := r.roles.Get(genericapirequest.WithNamespace(ctx, namespace), name, &metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return o.(*rbacv1.Role), nil
}

func (r *registryRoles) ListRoleBindings(ctx context.Context, namespace string) ([]*rbacv1.RoleBinding, error) {
	o, err := r.roleBindings.List(genericapirequest.WithNamespace(ctx, namespace), &metainternalversion.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []*rbacv1.RoleBinding
	for i := range o.(*rbacv1.RoleBindingList).Items {
		out = append(out, &o.(*rbacv1.RoleBindingList).Items[i])
	}
	return out, nil
}

func (r *registryRoles) GetClusterRole(ctx context.Context, name string) (*rbacv1.ClusterRole, error) {
	o, err := r.clusterRoles.Get(ctx, name, &metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return o.(*rbacv1.ClusterRole), nil
}

func (r *registryRoles) ListClusterRoleBindings(ctx context.Context) ([]*rbacv1.ClusterRoleBinding, error) {
	o, err := r.clusterRoleBindings.List(ctx, &metainternalversion.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []*rbacv1.ClusterRoleBinding
	for i := range o.(*rbacv1.ClusterRoleBindingList).Items {
		out = append(out, &o.(*rbacv1.ClusterRoleBindingList).Items[i])
	}
	return out, nil
}

// escalationAllowed: system:masters may write any role (escalation_check.go, EscalationAllowed).
func escalationAllowed(ctx context.Context) bool {
	u, ok := genericapirequest.UserFrom(ctx)
	if !ok {
		return false
	}
	for _, g := range u.GetGroups() {
		if g == user.SystemPrivilegedGroup {
			return true
		}
	}
	return false
}

// roleEscalationAuthorized: the user may "escalate" the Role or ClusterRole being written
// (escalation_check.go, RoleEscalationAuthorized).
func roleEscalationAuthorized(ctx context.Context, a authorizer.Authorizer) bool {
	u, ok := genericapirequest.UserFrom(ctx)
	if !ok {
		return false
	}
	info, ok := genericapirequest.RequestInfoFrom(ctx)
	if !ok || !info.IsResourceRequest || info.APIGroup != rbacv1.GroupName ||
		(info.Resource != "roles" && info.Resource != "clusterroles") {
		return false
	}
	decision, _, err := a.Authorize(ctx, authorizer.AttributesRecord{User: u, Verb: "escalate", APIGroup: info.APIGroup,
		APIVersion: "*", Resource: info.Resource, Name: info.Name, Namespace: info.Namespace, ResourceRequest: true})
	if err != nil {
		klog.ErrorS(err, "authorizing escalate", "user", u.GetName(), "resource", info.Resource, "name", info.Name)
	}
	return decision == authorizer.DecisionAllow
}

// bindingAuthorized: the user may "bind" the referenced role in the binding's namespace
// (escalation_check.go, BindingAuthorized).
func bindingAuthorized(ctx context.Context, ref rbacv1.RoleRef, bindingNamespace string, a authorizer.Authorizer) bool {
	u, ok := genericapirequest.UserFrom(ctx)
	if !ok {
		return false
	}
	attrs := authorizer.AttributesRecord{User: u, Verb: "bind", Namespace: bindingNamespace, ResourceRequest: true,
		APIGroup: ref.APIGroup, Name: ref.Name}
	switch ref.Kind {
	case "ClusterRole":
		attrs.Resource = "clusterroles"
	case "Role":
		attrs.Resource = "roles"
	default:
		return false
	}
	decision, _, err := a.Authorize(ctx, attrs)
	if err != nil {
		klog.ErrorS(err, "authorizing bind", "user", u.GetName(), "roleRef", ref)
	}
	return decision == authorizer.DecisionAllow
}

// confirmNoEscalation: the user already holds every permission of rules in the request's
// namespace (rule.go, ConfirmNoEscalation; the missing rules are listed broken down, not
// compacted by CompactRules as kube does).
func confirmNoEscalation(ctx context.Context, resolver ruleResolver, rules []rbacv1.PolicyRule) error {
	u, ok := genericapirequest.UserFrom(ctx)
	if !ok {
		return fmt.Errorf("no user on context")
	}
	namespace, _ := genericapirequest.NamespaceFrom(ctx)
	owner, err := resolver.rulesFor(ctx, u, namespace)
	var resolutionErrors []error
	if err != nil {
		klog.V(1).InfoS("non-fatal error getting local rules", "user", u.GetName(), "err", err)
		resolutionErrors = append(resolutionErrors, err)
	}
	covered, missing := validation.Covers(owner, rules)
	if covered {
		return nil
	}
	descriptions := map[string]bool{}
	for _, m := range missing {
		descriptions[compactString(m)] = true
	}
	var list []string
	for d := range descriptions {
		list = append(list, d)
	}
	sort.Strings(list)
	msg := fmt.Sprintf("user %q (groups=%q) is attempting to grant RBAC permissions not currently held:\n%s",
		u.GetName(), u.GetGroups(), strings.Join(list, "\n"))
	if len(resolutionErrors) > 0 {
		msg += fmt.Sprintf("; resolution errors: %v", resolutionErrors)
	}
	return errors.New(msg)
}

// isOnlyMutatingGCFields: the update changes nothing but owner references and finalizers
// (pkg/registry/rbac/helpers.go, IsOnlyMutatingGCFields).
func isOnlyMutatingGCFields(obj, old runtime.Object) bool {
	if old == nil || reflect.ValueOf(old).IsNil() {
		return false
	}
	copied := obj.DeepCopyObject()
	copiedMeta, err := meta.Accessor(copied)
	if err != nil {
		return false
	}
	oldMeta, err := meta.Accessor(old)
	if err != nil {
		return false
	}
	copiedMeta.SetOwnerReferences(oldMeta.GetOwnerReferences())
	copiedMeta.SetFinalizers(oldMeta.GetFinalizers())
	copiedMeta.SetSelfLink(oldMeta.GetSelfLink())
	copiedMeta.SetManagedFields(oldMeta.GetManagedFields())
	return equality.Semantic.DeepEqual(copied, old)
}

// rbacREST is the policybased storage of one RBAC resource: a write that would grant
// permissions its author does not hold is forbidden, unless the author is in system:masters,
// may "escalate" (roles) or may "bind" the referenced role (bindings).
type rbacREST struct {
	*mainREST
	authz    authorizer.Authorizer
	resolver ruleResolver
}

// grants is what a written object grants: a role's rules, or a binding's role reference
// (whose rules are resolved in check, after the bind verb is asked about).
func grants(obj runtime.Object) (rules []rbacv1.PolicyRule, ref *rbacv1.RoleRef, err error) {
	switch o := obj.(type) {
	case *rbacv1.Role:
		return o.Rules, nil, nil
	case *rbacv1.ClusterRole:
		return o.Rules, nil, nil
	case *rbacv1.RoleBinding:
		return nil, &o.RoleRef, nil
	case *rbacv1.ClusterRoleBinding:
		return nil, &o.RoleRef, nil
	default:
		return nil, nil, fmt.Errorf("not an RBAC object: %T", obj)
	}
}

// check forbids obj unless its author may write it.
func (r *rbacREST) check(ctx context.Context, obj runtime.Object) error {
	if escalationAllowed(ctx) {
		return nil
	}
	rules, ref, err := grants(obj)
	if err != nil {
		return err
	}
	name := ""
	if m, err := meta.Accessor(obj); err == nil {
		name = m.GetName()
	}
	if ref == nil {
		if roleEscalationAuthorized(ctx, r.authz) {
			return nil
		}
	} else {
		namespace, _ := genericapirequest.NamespaceFrom(ctx)
		if bindingAuthorized(ctx, *ref, namespace, r.authz) {
			return nil
		}
		rules, err = r.resolver.getRoleReferenceRules(ctx, *ref, namespace)
		if err != nil {
			return err
		}
	}
	if err := confirmNoEscalation(ctx, r.resolver, rules); err != nil {
		return apierrors.NewForbidden(r.DefaultQualifiedResource, name, err)
	}
	return nil
}

func (r *rbacREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	if err := r.check(ctx, obj); err != nil {
		return nil, err
	}
	return r.Store.Create(ctx, obj, createValidation, options)
}

func (r *rbacREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc,
	updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	if escalationAllowed(ctx) {
		return r.Store.Update(ctx, name, objInfo, createValidation, updateValidation, forceAllowCreate, options)
	}
	checked := rest.WrapUpdatedObjectInfo(objInfo, func(ctx context.Context, obj, old runtime.Object) (runtime.Object, error) {
		if isOnlyMutatingGCFields(obj, old) {
			return obj, nil
		}
		return obj, r.check(ctx, obj)
	})
	return r.Store.Update(ctx, name, checked, createValidation, updateValidation, forceAllowCreate, options)
}

// --- the bootstrap policy: plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go of
// Kubernetes v1.36 (ClusterRoles and ClusterRoleBindings), the part every component relies on -

func bootstrapMeta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/bootstrapping": "rbac-defaults"},
		Annotations: map[string]string{"rbac.authorization.kubernetes.io/autoupdate": "true"}}
}

func bootstrapClusterRoles() []rbacv1.ClusterRole {
	return []rbacv1.ClusterRole{
		{ObjectMeta: bootstrapMeta("cluster-admin"), Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}},
			{NonResourceURLs: []string{"*"}, Verbs: []string{"*"}},
		}},
		{ObjectMeta: bootstrapMeta("system:discovery"), Rules: []rbacv1.PolicyRule{
			{NonResourceURLs: []string{"/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
				"/readyz", "/version", "/version/"}, Verbs: []string{"get"}},
		}},
		{ObjectMeta: bootstrapMeta("system:basic-user"), Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"selfsubjectaccessreviews", "selfsubjectrulesreviews"},
				Verbs: []string{"create"}},
			{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"selfsubjectreviews"}, Verbs: []string{"create"}},
		}},
		{ObjectMeta: bootstrapMeta("system:public-info-viewer"), Rules: []rbacv1.PolicyRule{
			{NonResourceURLs: []string{"/healthz", "/livez", "/readyz", "/version", "/version/"}, Verbs: []string{"get"}},
		}},
	}
}

func bootstrapClusterRoleBindings() []rbacv1.ClusterRoleBinding {
	bind := func(role string, groups ...string) rbacv1.ClusterRoleBinding {
		b := rbacv1.ClusterRoleBinding{ObjectMeta: bootstrapMeta(role),
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role}}
		for _, g := range groups {
			b.Subjects = append(b.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: g})
		}
		return b
	}
	return []rbacv1.ClusterRoleBinding{
		bind("cluster-admin", user.SystemPrivilegedGroup),
		bind("system:discovery", user.AllAuthenticated),
		bind("system:basic-user", user.AllAuthenticated),
		bind("system:public-info-viewer", user.AllAuthenticated, user.AllUnauthenticated),
	}
}

// addRBACHooks creates the bootstrap policy and, when RBAC authorizes, makes /readyz wait
// until the authorizer's informers have synced (kube-apiserver's rbac/bootstrap-roles hook).
func addRBACHooks(s *genericapiserver.GenericAPIServer, roles *informerRoles) error {
	return s.AddPostStartHook("rbac/bootstrap-roles", func(hook genericapiserver.PostStartHookContext) error {
		client, err := kubernetes.NewForConfig(hook.LoopbackClientConfig)
		if err != nil {
			return err
		}
		created := false
		// A short interval: /readyz waits for this hook, and every test process starts a server.
		return wait.PollUntilContextTimeout(hook, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			if created {
				return roles == nil || roles.hasSynced(), nil
			}
			for _, role := range bootstrapClusterRoles() {
				if _, err := client.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					klog.V(2).InfoS("creating a bootstrap ClusterRole", "name", role.Name, "err", err)
					return false, nil
				}
			}
			for _, binding := range bootstrapClusterRoleBindings() {
				if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					klog.V(2).InfoS("creating a bootstrap ClusterRoleBinding", "name", binding.Name, "err", err)
					return false, nil
				}
			}
			created = true
			return roles == nil || roles.hasSynced(), nil
		})
	})
}
